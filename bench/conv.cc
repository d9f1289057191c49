// Winograd against direct convolution, through kiln's onednn.conv kernel (so with the reorders
// between kiln's NHWC tensors and Winograd's blocked ones), on the 3x3 stride-1 convolutions of
// the test suite's models: ResNet-50's four stages and YOLO-style C2f bottlenecks, batch 1, as
// `kiln compile` makes them (channels-last FusedConv with bias and Relu). Each shape is a
// one-node model run twice, its kernel pinned with the parameter algorithm=direct and =winograd;
// calls interleaved, median of --runs, and the relative L2 between the two outputs.
// `--depthwise` times kiln's channels-last depthwise kernel (kiln.dwconv) against oneDNN's on
// EfficientNet-B0's and MobileNetV2's depthwise layers instead, each with its model's epilogue
// (SiLU, Clip 0..6) and without one.
//
//   kiln_bench_conv [--runs N] [--threads T] [--depthwise]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/session.h"
#include "runtime/threads.h"

namespace {

using clock_type = std::chrono::steady_clock;

struct ConvShape {
  int64_t c, hw, m;
  const char* what;
};

kiln::Tensor filled(std::vector<int64_t> shape, float step, float scale) {
  kiln::Tensor t(kiln::DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * std::sin(static_cast<float>(i) * step);
  return t;
}

// A channels-last FusedConv 3x3 / 1 / pad 1 with bias and Relu, its kernel pinned to oneDNN with
// the given algorithm.
kiln::Model conv_model(const ConvShape& s, const std::string& algorithm) {
  kiln::Model m;
  kiln::Graph& g = m.graph;
  const kiln::ValueId x = g.add_value("x", kiln::DType::f32, kiln::Shape::of(std::vector<int64_t>{1, s.hw, s.hw, s.c}));
  g.inputs.push_back(x);
  const kiln::ValueId w = g.add_constant("w", filled({s.m, s.c, 3, 3}, 0.013f, 0.1f));
  const kiln::ValueId b = g.add_constant("b", filled({s.m}, 0.1f, 0.1f));
  const kiln::ValueId y = g.add_value("y", kiln::DType::f32, kiln::Shape::of(std::vector<int64_t>{1, s.hw, s.hw, s.m}));
  g.outputs.push_back(y);
  kiln::Node n;
  n.name = "conv";
  n.op = "FusedConv";
  n.inputs = {x, w, b};
  n.outputs = {y};
  n.set_attr("pads", std::vector<int64_t>{1, 1, 1, 1});
  n.set_attr("channels_last", int64_t{1});
  n.set_attr("activation", std::string("Relu"));
  n.kernel = kiln::KernelChoice{"onednn.conv", {{"algorithm", algorithm}}};
  g.add_node(std::move(n));
  return m;
}

struct DepthwiseShape {
  int64_t c, hw, k, stride;
  const char* activation;  // "" for none
  const char* what;
};

// A channels-last depthwise FusedConv k x k / stride, pad k / 2, with bias and the activation,
// on the given kernel.
kiln::Model depthwise_model(const DepthwiseShape& s, const std::string& kernel) {
  kiln::Model m;
  kiln::Graph& g = m.graph;
  const int64_t out = (s.hw - 1) / s.stride + 1, p = s.k / 2;
  const kiln::ValueId x = g.add_value("x", kiln::DType::f32, kiln::Shape::of(std::vector<int64_t>{1, s.hw, s.hw, s.c}));
  g.inputs.push_back(x);
  const kiln::ValueId w = g.add_constant("w", filled({s.c, 1, s.k, s.k}, 0.013f, 0.3f));
  const kiln::ValueId b = g.add_constant("b", filled({s.c}, 0.1f, 0.1f));
  const kiln::ValueId y = g.add_value("y", kiln::DType::f32, kiln::Shape::of(std::vector<int64_t>{1, out, out, s.c}));
  g.outputs.push_back(y);
  kiln::Node n;
  n.name = "dwconv";
  n.op = "FusedConv";
  n.inputs = {x, w, b};
  n.outputs = {y};
  n.set_attr("group", s.c);
  n.set_attr("pads", std::vector<int64_t>{p, p, p, p});
  n.set_attr("strides", std::vector<int64_t>{s.stride, s.stride});
  n.set_attr("channels_last", int64_t{1});
  if (*s.activation) n.set_attr("activation", std::string(s.activation));
  if (std::string(s.activation) == "Clip") n.set_attr("activation_params", std::vector<double>{0, 6});
  n.kernel = kiln::KernelChoice{kernel, {}};
  g.add_node(std::move(n));
  return m;
}

// Times two models' runs on `in` on `threads` threads, interleaved: their medians and spreads,
// the relative L2 between their outputs, and the label of b's first kernel; false (with the
// error printed) when a session cannot be made or a run fails.
struct Timed {
  double ma, sa, mb, sb, rel_l2;
  std::string b_label;
};
bool time_models(const kiln::Model& ma, const kiln::Model& mb, int threads, const std::vector<kiln::Tensor>& in, int runs,
                 Timed& t) {
  kiln::SessionOptions options;
  options.target.threads = threads;
  auto sa = kiln::Session::create(ma, options), sb = kiln::Session::create(mb, options);
  if (!sa.ok() || !sb.ok()) {
    std::fprintf(stderr, "kiln_bench_conv: %s\n", (sa.ok() ? sb.error() : sa.error()).message().c_str());
    return false;
  }
  kiln::Session &a = **sa, &b = **sb;
  std::vector<double> ta, tb;
  std::vector<kiln::Tensor> ya, yb;
  for (int r = -3; r < runs; ++r) {
    for (int which = 0; which < 2; ++which) {
      const auto t0 = clock_type::now();
      auto y = (which ? b : a).run(in);
      const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
      if (!y.ok()) {
        std::fprintf(stderr, "kiln_bench_conv: %s\n", y.error().message().c_str());
        return false;
      }
      if (r >= 0) (which ? tb : ta).push_back(ms);
      (which ? yb : ya) = std::move(*y);
    }
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < ya[0].numel(); ++i) {
    const double d = ya[0].data<float>()[i] - yb[0].data<float>()[i];
    num += d * d;
    den += static_cast<double>(ya[0].data<float>()[i]) * ya[0].data<float>()[i];
  }
  auto stats = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    return std::pair{med, (v.back() - v.front()) / med};
  };
  std::tie(t.ma, t.sa) = stats(ta);
  std::tie(t.mb, t.sb) = stats(tb);
  t.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  t.b_label = b.kernels()[0].label;
  return true;
}

int depthwise(int runs, int threads) {
  const std::string kiln_kernel = std::string("kiln.dwconv_f32_") + (kiln::CpuFeatures::host().avx512f ? "avx512" : "avx2");
  const DepthwiseShape shapes[] = {
      {32, 112, 3, 1, "Silu", "EfficientNet-B0 stage 1"}, {96, 112, 3, 2, "Silu", "EfficientNet-B0 stage 2 (down)"},
      {144, 56, 3, 1, "Silu", "EfficientNet-B0 stage 2"},  {240, 28, 5, 1, "Silu", "EfficientNet-B0 stage 3"},
      {480, 14, 3, 1, "Silu", "EfficientNet-B0 stage 4"},  {672, 14, 5, 1, "Silu", "EfficientNet-B0 stage 5"},
      {1152, 7, 5, 1, "Silu", "EfficientNet-B0 stage 6"},  {144, 56, 3, 1, "", "EfficientNet-B0 stage 2"},
      {672, 14, 5, 1, "", "EfficientNet-B0 stage 5"},      {32, 112, 3, 1, "Clip", "MobileNetV2 stage 1"},
      {144, 56, 3, 1, "Clip", "MobileNetV2 stage 2"},     {192, 28, 3, 1, "Clip", "MobileNetV2 stage 3"},
      {384, 14, 3, 1, "Clip", "MobileNetV2 stage 4"},     {960, 7, 3, 1, "Clip", "MobileNetV2 stage 6"}};
  std::printf("# channels-last depthwise FusedConv + bias (+ activation), batch 1, %d thread(s); median of %d calls each, "
              "interleaved; spread = (max - min) / median\n",
              threads, runs);
  std::printf("%-46s %10s %7s %10s %7s %9s %10s\n", "shape", "oneDNN ms", "spread", "kiln ms", "spread", "oneDNN/kiln", "rel L2");
  for (const DepthwiseShape& s : shapes) {
    Timed t;
    if (!time_models(depthwise_model(s, "onednn.conv"), depthwise_model(s, kiln_kernel), threads,
                     {filled({1, s.hw, s.hw, s.c}, 0.01f, 1.f)}, runs, t))
      return 1;
    const std::string name = std::to_string(s.c) + " " + std::to_string(s.hw) + "x" + std::to_string(s.hw) + " " +
                             std::to_string(s.k) + "x" + std::to_string(s.k) + "/" + std::to_string(s.stride) + " " +
                             (*s.activation ? s.activation : "none") + " " + s.what;
    std::printf("%-46s %10.3f %6.0f%% %10.3f %6.0f%% %9.2f %10.1e\n", name.c_str(), t.ma, 100 * t.sa, t.mb, 100 * t.sb,
                t.ma / t.mb, t.rel_l2);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 51, threads = 1;
  bool dw = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--depthwise") dw = true;
    else if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: kiln_bench_conv [--runs N] [--threads T] [--depthwise]\n");
      return 2;
    }
  }
  if (dw) return depthwise(runs, threads);
  const ConvShape shapes[] = {{64, 56, 64, "ResNet-50 stage 1"},   {128, 28, 128, "ResNet-50 stage 2"},
                              {256, 14, 256, "ResNet-50 stage 3"}, {512, 7, 512, "ResNet-50 stage 4"},
                              {16, 80, 16, "YOLO C2f 80x80"},     {32, 40, 32, "YOLO C2f 40x40"},
                              {64, 20, 64, "YOLO C2f 20x20"},     {128, 10, 128, "YOLO C2f 10x10"}};
  std::printf("# onednn.conv, channels-last FusedConv 3x3/1 + bias + Relu, batch 1, %d thread(s); median of %d calls each, "
              "interleaved; spread = (max - min) / median\n",
              threads, runs);
  std::printf("%-34s %10s %7s %10s %7s %7s %10s  %s\n", "shape", "direct ms", "spread", "wino ms", "spread", "speedup", "rel L2",
              "winograd used");
  for (const ConvShape& s : shapes) {
    Timed t;
    if (!time_models(conv_model(s, "direct"), conv_model(s, "winograd"), threads, {filled({1, s.hw, s.hw, s.c}, 0.01f, 1.f)},
                     runs, t))
      return 1;
    const std::string name = std::to_string(s.c) + "->" + std::to_string(s.m) + " " + std::to_string(s.hw) + "x" +
                             std::to_string(s.hw) + " " + s.what;
    std::printf("%-34s %10.3f %6.0f%% %10.3f %6.0f%% %7.2f %10.1e  %s\n", name.c_str(), t.ma, 100 * t.sa, t.mb, 100 * t.sb,
                t.ma / t.mb, t.rel_l2, t.b_label == "winograd" ? "yes" : "no (not on this CPU)");
  }
  return 0;
}
