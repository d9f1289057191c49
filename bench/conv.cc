// Winograd against direct convolution on the 3x3 stride-1 convolutions of the test suite's
// models: ResNet-50's four stages and YOLO-style C2f bottlenecks, batch 1, as `kiln compile`
// makes them (channels-last FusedConv with bias and Relu). Each shape is a one-node model run
// five times, its kernel pinned: oneDNN's (kiln's onednn.conv, so with the reorders between
// kiln's NHWC tensors and its blocked ones) with the parameter algorithm=direct and =winograd,
// kiln.winograd with tile=4 and =2, and kiln's GEMM over the gathered windows (kiln.gemm); calls
// interleaved, median of --runs, and the relative L2 between the Winograd outputs and the direct one's.
// `--depthwise` times kiln's channels-last depthwise kernel (kiln.dwconv) against oneDNN's on
// EfficientNet-B0's and MobileNetV2's depthwise layers instead, each with its model's epilogue
// (SiLU, Clip 0..6) and without one; `--first` kiln's direct convolution of few input channels
// (kiln.direct_conv) against oneDNN's on the image models' first layers, over RGB.
//
//   kiln_bench_conv [--runs N] [--threads T] [--depthwise | --first]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
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

// A channels-last FusedConv 3x3 / 1 / pad 1 with bias and Relu, its kernel pinned.
kiln::Model conv_model(const ConvShape& s, kiln::KernelChoice kernel) {
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
  n.kernel = std::move(kernel);
  g.add_node(std::move(n));
  return m;
}

// A layer: c (output) channels, hw x hw input pixels, a k x k filter at `stride`.
struct LayerShape {
  int64_t c, hw, k, stride;
  const char* activation;  // "" for none
  const char* what;
};

// A channels-last FusedConv k x k / stride, pad k / 2, with bias and the activation, on the
// given kernel: depthwise over s.c channels, or (`in` > 0) from `in` channels to s.c; with
// `planar`, X is read as the image comes, [1, in, hw, hw] (x_channels_first, as compile leaves a
// first layer's).
kiln::Model layer_model(const LayerShape& s, const std::string& kernel, int64_t in = 0, bool planar = false) {
  kiln::Model m;
  kiln::Graph& g = m.graph;
  const int64_t out = (s.hw - 1) / s.stride + 1, p = s.k / 2;
  const std::vector<int64_t> xs = planar ? std::vector<int64_t>{1, in, s.hw, s.hw} : std::vector<int64_t>{1, s.hw, s.hw, in ? in : s.c};
  const kiln::ValueId x = g.add_value("x", kiln::DType::f32, kiln::Shape::of(xs));
  g.inputs.push_back(x);
  const kiln::ValueId w = g.add_constant("w", filled({s.c, in ? in : 1, s.k, s.k}, 0.013f, 0.3f));
  const kiln::ValueId b = g.add_constant("b", filled({s.c}, 0.1f, 0.1f));
  const kiln::ValueId y = g.add_value("y", kiln::DType::f32, kiln::Shape::of(std::vector<int64_t>{1, out, out, s.c}));
  g.outputs.push_back(y);
  kiln::Node n;
  n.name = "dwconv";
  n.op = "FusedConv";
  n.inputs = {x, w, b};
  n.outputs = {y};
  if (!in) n.set_attr("group", s.c);
  n.set_attr("pads", std::vector<int64_t>{p, p, p, p});
  n.set_attr("strides", std::vector<int64_t>{s.stride, s.stride});
  n.set_attr("channels_last", int64_t{1});
  if (planar) n.set_attr("x_channels_first", int64_t{1});
  if (*s.activation) n.set_attr("activation", std::string(s.activation));
  if (std::string(s.activation) == "Clip") n.set_attr("activation_params", std::vector<double>{0, 6});
  n.kernel = kiln::KernelChoice{kernel, {}};
  g.add_node(std::move(n));
  return m;
}

// Times models' runs on `in` on `threads` threads, interleaved: each one's median and spread,
// the relative L2 between its output and the first model's, and its first kernel's label;
// false (with the error printed) when a session cannot be made or a run fails.
struct Timed {
  double median, spread, rel_l2;
  std::string label;
};
bool time_models(const std::vector<kiln::Model>& models, int threads, const std::vector<std::vector<kiln::Tensor>>& ins, int runs,
                 std::vector<Timed>& out) {
  kiln::SessionOptions options;
  options.target.threads = threads;
  std::vector<std::unique_ptr<kiln::Session>> sessions;
  for (const kiln::Model& m : models) {
    auto s = kiln::Session::create(m, options);
    if (!s.ok()) {
      std::fprintf(stderr, "kiln_bench_conv: %s\n", s.error().message().c_str());
      return false;
    }
    sessions.push_back(std::move(*s));
  }
  std::vector<std::vector<double>> times(models.size());
  std::vector<std::vector<kiln::Tensor>> ys(models.size());
  for (int r = -3; r < runs; ++r) {
    for (size_t which = 0; which < sessions.size(); ++which) {
      const auto t0 = clock_type::now();
      auto y = sessions[which]->run(ins[which]);
      const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
      if (!y.ok()) {
        std::fprintf(stderr, "kiln_bench_conv: %s\n", y.error().message().c_str());
        return false;
      }
      if (r >= 0) times[which].push_back(ms);
      ys[which] = std::move(*y);
    }
  }
  out.clear();
  for (size_t which = 0; which < sessions.size(); ++which) {
    double num = 0, den = 0;
    const float *a = ys[0][0].data<float>(), *b = ys[which][0].data<float>();
    for (int64_t i = 0; i < ys[0][0].numel(); ++i) {
      const double d = a[i] - b[i];
      num += d * d;
      den += static_cast<double>(a[i]) * a[i];
    }
    std::vector<double> v = times[which];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    out.push_back({med, (v.back() - v.front()) / med, std::sqrt(num / std::max(den, 1e-300)), sessions[which]->kernels()[0].label});
  }
  return true;
}

// Times each layer on oneDNN's convolution and on kiln's `kernel` (its ISA appended), interleaved,
// and prints a row per layer: depthwise over s.c channels, or from `in` channels to s.c.
int against_onednn(const std::string& kernel, const std::vector<LayerShape>& shapes, int64_t in, const char* what, int runs,
                   int threads, bool planar = false) {
  const std::string kiln_kernel = kernel + (kiln::CpuFeatures::host().avx512f ? "avx512" : "avx2");
  std::printf("# channels-last %s, batch 1, %d thread(s); median of %d calls each, interleaved; spread = (max - min) / median\n", what,
              threads, runs);
  std::printf("%-46s %10s %7s %10s %7s %9s %10s%s\n", "shape", "oneDNN ms", "spread", "kiln ms", "spread", "oneDNN/kiln", "rel L2",
              planar ? "  kiln planar ms  spread  rel L2" : "");
  for (const LayerShape& s : shapes) {
    std::vector<Timed> t;
    const kiln::Tensor x = filled({1, s.hw, s.hw, in ? in : s.c}, 0.01f, 1.f);
    std::vector<kiln::Model> models = {layer_model(s, "onednn.conv", in), layer_model(s, kiln_kernel, in)};
    std::vector<std::vector<kiln::Tensor>> ins = {{x}, {x}};
    if (planar) {  // the same image as planes
      kiln::Tensor planes(kiln::DType::f32, {1, in, s.hw, s.hw});
      for (int64_t c = 0; c < in; ++c)
        for (int64_t p = 0; p < s.hw * s.hw; ++p) planes.data<float>()[c * s.hw * s.hw + p] = x.data<float>()[p * in + c];
      models.push_back(layer_model(s, kiln_kernel, in, true));
      ins.push_back({planes});
    }
    if (!time_models(models, threads, ins, runs, t)) return 1;
    const std::string name = (in ? std::to_string(in) + "->" : std::string()) + std::to_string(s.c) + " " + std::to_string(s.hw) +
                             "x" + std::to_string(s.hw) + " " + std::to_string(s.k) + "x" + std::to_string(s.k) + "/" +
                             std::to_string(s.stride) + " " + (*s.activation ? s.activation : "none") + " " + s.what;
    std::printf("%-46s %10.3f %6.0f%% %10.3f %6.0f%% %9.2f %10.1e", name.c_str(), t[0].median, 100 * t[0].spread, t[1].median,
                100 * t[1].spread, t[0].median / t[1].median, t[1].rel_l2);
    if (planar) std::printf("  %14.3f %6.0f%% %7.1e", t[2].median, 100 * t[2].spread, t[2].rel_l2);
    std::printf("\n");
  }
  return 0;
}

int depthwise(int runs, int threads) {
  const std::vector<LayerShape> shapes = {
      {32, 112, 3, 1, "Silu", "EfficientNet-B0 stage 1"}, {96, 112, 3, 2, "Silu", "EfficientNet-B0 stage 2 (down)"},
      {144, 56, 5, 2, "Silu", "EfficientNet-B0 stage 3 (down)"}, {240, 28, 3, 2, "Silu", "EfficientNet-B0 stage 4 (down)"},
      {672, 14, 5, 2, "Silu", "EfficientNet-B0 stage 6 (down)"},
      {144, 56, 3, 1, "Silu", "EfficientNet-B0 stage 2"},  {240, 28, 5, 1, "Silu", "EfficientNet-B0 stage 3"},
      {480, 14, 3, 1, "Silu", "EfficientNet-B0 stage 4"},  {672, 14, 5, 1, "Silu", "EfficientNet-B0 stage 5"},
      {1152, 7, 5, 1, "Silu", "EfficientNet-B0 stage 6"},  {144, 56, 3, 1, "", "EfficientNet-B0 stage 2"},
      {672, 14, 5, 1, "", "EfficientNet-B0 stage 5"},      {32, 112, 3, 1, "Clip", "MobileNetV2 stage 1"},
      {144, 56, 3, 1, "Clip", "MobileNetV2 stage 2"},     {192, 28, 3, 1, "Clip", "MobileNetV2 stage 3"},
      {384, 14, 3, 1, "Clip", "MobileNetV2 stage 4"},     {960, 7, 3, 1, "Clip", "MobileNetV2 stage 6"}};
  return against_onednn("kiln.dwconv_f32_", shapes, 0, "depthwise FusedConv + bias (+ activation)", runs, threads);
}

int first_layers(int runs, int threads) {
  const std::vector<LayerShape> shapes = {{32, 224, 3, 2, "Silu", "EfficientNet-B0"},
                                              {32, 224, 3, 2, "Clip", "MobileNetV2"},
                                              {16, 320, 3, 2, "Silu", "YOLO (320x320)"},
                                              {64, 224, 7, 2, "Relu", "ResNet-50"}};
  return against_onednn("kiln.direct_conv_f32_", shapes, 3, "FusedConv from 3 channels + bias + activation", runs, threads, true);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 51, threads = 1;
  bool dw = false, first = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--depthwise") dw = true;
    else if (a == "--first") first = true;
    else if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: kiln_bench_conv [--runs N] [--threads T] [--depthwise | --first]\n");
      return 2;
    }
  }
  if (dw) return depthwise(runs, threads);
  if (first) return first_layers(runs, threads);
  const ConvShape shapes[] = {{64, 56, 64, "ResNet-50 stage 1"},   {128, 28, 128, "ResNet-50 stage 2"},
                              {256, 14, 256, "ResNet-50 stage 3"}, {512, 7, 512, "ResNet-50 stage 4"},
                              {16, 80, 16, "YOLO C2f 80x80"},     {32, 40, 32, "YOLO C2f 40x40"},
                              {64, 20, 64, "YOLO C2f 20x20"},     {128, 10, 128, "YOLO C2f 10x10"}};
  const std::string isa = kiln::CpuFeatures::host().avx512f ? "avx512" : "avx2";
  const std::string kiln_kernel = "kiln.winograd_f32_" + isa;
  std::printf("# channels-last FusedConv 3x3/1 + bias + Relu, batch 1, %d thread(s): oneDNN's direct and Winograd algorithms, "
              "kiln's Winograd F(4x4, 3x3) and F(2x2, 3x3) and kiln's GEMM over the windows; median of %d calls each, "
              "interleaved; spread = (max - min) / median; rel L2 against the direct one's output\n",
              threads, runs);
  std::printf("%-32s %13s %13s %13s %13s %13s %8s %8s %8s %8s %8s  %s\n", "shape", "direct ms", "dnn-wino ms", "kiln-4x4 ms",
              "kiln-2x2 ms", "kiln-gemm ms", "dir/k4", "dnn/k4", "dnn/k2", "gemm/k2", "L2 k4", "oneDNN's Winograd used");
  for (const ConvShape& s : shapes) {
    std::vector<Timed> t;
    if (!time_models({conv_model(s, {"onednn.conv", {{"algorithm", std::string("direct")}}}),
                      conv_model(s, {"onednn.conv", {{"algorithm", std::string("winograd")}}}),
                      conv_model(s, {kiln_kernel, {{"tile", int64_t{4}}}}), conv_model(s, {kiln_kernel, {{"tile", int64_t{2}}}}),
                      conv_model(s, {"kiln.gemm_f32_" + isa, {}})},
                     threads, std::vector<std::vector<kiln::Tensor>>(5, {filled({1, s.hw, s.hw, s.c}, 0.01f, 1.f)}), runs, t))
      return 1;
    const std::string name = std::to_string(s.c) + "->" + std::to_string(s.m) + " " + std::to_string(s.hw) + "x" +
                             std::to_string(s.hw) + " " + s.what;
    auto cell = [](const Timed& x) {
      char b[32];
      std::snprintf(b, sizeof b, "%.3f (%2.0f%%)", x.median, 100 * x.spread);
      return std::string(b);
    };
    std::printf("%-32s %13s %13s %13s %13s %13s %8.2f %8.2f %8.2f %8.2f %8.1e  %s\n", name.c_str(), cell(t[0]).c_str(),
                cell(t[1]).c_str(), cell(t[2]).c_str(), cell(t[3]).c_str(), cell(t[4]).c_str(), t[0].median / t[2].median,
                t[1].median / t[2].median, t[1].median / t[3].median, t[4].median / t[3].median, t[2].rel_l2,
                t[1].label == "winograd" ? "yes" : "no (not on this CPU)");
  }
  return 0;
}
