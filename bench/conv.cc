// Winograd against direct convolution, through kiln's onednn.conv kernel (so with the reorders
// between kiln's NHWC tensors and Winograd's blocked ones), on the 3x3 stride-1 convolutions of
// the test suite's models: ResNet-50's four stages and YOLO-style C2f bottlenecks, batch 1, as
// `kiln compile` makes them (channels-last FusedConv with bias and Relu). Each shape is a
// one-node model run twice, its kernel pinned with the parameter algorithm=direct and =winograd;
// calls interleaved, median of --runs, and the relative L2 between the two outputs.
//
//   kiln_bench_conv [--runs N] [--threads T]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  int runs = 51, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--threads") threads = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: kiln_bench_conv [--runs N] [--threads T]\n");
      return 2;
    }
  }
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
    kiln::Model direct = conv_model(s, "direct"), wino = conv_model(s, "winograd");
    kiln::SessionOptions options;
    options.target.threads = threads;
    auto a = kiln::Session::create(direct, options), b = kiln::Session::create(wino, options);
    if (!a.ok() || !b.ok()) {
      std::fprintf(stderr, "kiln_bench_conv: %s\n", (a.ok() ? b.error() : a.error()).message().c_str());
      return 1;
    }
    const std::vector<kiln::Tensor> in = {filled({1, s.hw, s.hw, s.c}, 0.01f, 1.f)};
    std::vector<double> ta, tb;
    std::vector<kiln::Tensor> ya, yb;
    for (int r = -3; r < runs; ++r) {
      for (int which = 0; which < 2; ++which) {
        const auto t0 = clock_type::now();
        auto y = (which ? *b : *a)->run(in);
        const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        if (!y.ok()) {
          std::fprintf(stderr, "kiln_bench_conv: %s\n", y.error().message().c_str());
          return 1;
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
    auto stats = [](std::vector<double> t) {
      std::sort(t.begin(), t.end());
      const double med = t[t.size() / 2];
      return std::pair{med, (t.back() - t.front()) / med};
    };
    const auto [ma, sa] = stats(ta);
    const auto [mb, sb] = stats(tb);
    const std::string name = std::to_string(s.c) + "->" + std::to_string(s.m) + " " + std::to_string(s.hw) + "x" +
                             std::to_string(s.hw) + " " + s.what;
    std::printf("%-34s %10.3f %6.0f%% %10.3f %6.0f%% %7.2f %10.1e  %s\n", name.c_str(), ma, 100 * sa, mb, 100 * sb, ma / mb,
                std::sqrt(num / std::max(den, 1e-300)), (*b)->kernels()[0].label == "winograd" ? "yes" : "no (not on this CPU)");
  }
  return 0;
}
