// Times kiln's reference kernels on the two problem sizes that dominate the real models: the
// 3x3 64->64 convolution on 56x56 of ResNet-50's first stage and BERT-base's 128x768 @ 768x768
// projection. Each runs as a one-node model through kiln::Session, the way `kiln run` executes
// it; the program prints the median of N runs and the GFLOP/s that median gives.
//
//   kiln_bench_ref_kernels [--runs N] [--warmup N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/session.h"

namespace {

using kiln::Result;
using kiln::Tensor;

/// One problem: a node of `op` over f32 graph inputs, and the floating-point operations it does.
struct Problem {
  std::string label;
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<kiln::Attribute> attrs;
  double flops;  ///< 2 per multiply-add
};

/// Deterministic, non-zero, mixed-sign data (the values the nn unit tests use), so the timing
/// never sees denormals or all-zero operands a kernel could skip.
Tensor ramp(std::vector<int64_t> shape, float scale) {
  Tensor t(kiln::DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * static_cast<float>((i * 7) % 13 - 6) + 0.05f;
  return t;
}

struct Timing {
  double create_s = 0;               ///< Session::create: inference, kernel choice and prepare
  std::vector<double> run_s;         ///< each timed Session::run, sorted
  double median() const {
    const size_t n = run_s.size();
    return n % 2 ? run_s[n / 2] : (run_s[n / 2 - 1] + run_s[n / 2]) / 2;
  }
};

/// Builds the one-node model, prepares a session once and times `runs` calls of run() after
/// `warmup` untimed ones (the first run plans memory and touches pages).
Result<Timing> time_problem(const Problem& p, int warmup, int runs) {
  using clock = std::chrono::steady_clock;
  kiln::Model m;
  kiln::Graph& g = m.graph;
  kiln::Node n;
  n.name = p.label;
  n.op = p.op;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    kiln::ValueId v = g.add_value("in" + std::to_string(i), p.inputs[i].dtype(), kiln::Shape::of(p.inputs[i].shape()));
    g.inputs.push_back(v);
    n.inputs.push_back(v);
  }
  kiln::ValueId out = g.add_value("out", kiln::DType::undefined);
  n.outputs.push_back(out);
  g.outputs.push_back(out);
  for (const auto& a : p.attrs) n.set_attr(a.name, a.value);
  g.add_node(std::move(n));

  Timing t;
  auto t0 = clock::now();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::Session> session,
                        kiln::Session::create(m, kiln::SessionOptions{.reference = true}));
  t.create_s = std::chrono::duration<double>(clock::now() - t0).count();
  for (int i = 0; i < warmup; ++i) KILN_RETURN_IF_ERROR(session->run(p.inputs).status());
  for (int i = 0; i < runs; ++i) {
    auto r0 = clock::now();
    KILN_RETURN_IF_ERROR(session->run(p.inputs).status());
    t.run_s.push_back(std::chrono::duration<double>(clock::now() - r0).count());
  }
  std::sort(t.run_s.begin(), t.run_s.end());
  return t;
}

/// A count of at least `min` (and at most 100000) from argv, or -1.
int parse_count(const char* s, int min) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  return (end != s && *end == '\0' && v >= min && v <= 100000) ? static_cast<int>(v) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 11, warmup = 2;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("usage: kiln_bench_ref_kernels [--runs N] [--warmup N]\n"
                  "Times kiln's reference Conv and MatMul kernels; prints the median of N runs (default 11)\n"
                  "after untimed warm-up runs (default 2) and the GFLOP/s of that median.\n");
      return 0;
    }
    if ((a == "--runs" || a == "--warmup") && i + 1 < argc) {
      const int min = a == "--runs" ? 1 : 0;
      int v = parse_count(argv[++i], min);
      if (v < 0) {
        std::fprintf(stderr, "kiln_bench_ref_kernels: error: %s: expected a count from %d to 100000, got '%s'\n", a.data(),
                     min, argv[i]);
        return 2;
      }
      (a == "--runs" ? runs : warmup) = v;
      continue;
    }
    std::fprintf(stderr, "kiln_bench_ref_kernels: error: unknown argument '%s' (see --help)\n", argv[i]);
    return 2;
  }

  std::vector<Problem> problems;
  problems.push_back({"conv 3x3 64->64 on 56x56", "Conv", {ramp({1, 64, 56, 56}, 0.25f), ramp({64, 64, 3, 3}, 0.01f)},
                      {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}, 2.0 * 64 * 64 * 9 * 56 * 56});
  problems.push_back({"matmul 128x768 @ 768x768", "MatMul", {ramp({128, 768}, 0.25f), ramp({768, 768}, 0.01f)}, {},
                      2.0 * 128 * 768 * 768});

  std::printf("%-26s %10s %6s %10s %17s %8s\n", "kernel", "prepare ms", "runs", "median ms", "min-max ms", "GFLOP/s");
  int failed = 0;
  for (const Problem& p : problems) {
    auto t = time_problem(p, warmup, runs);
    if (!t.ok()) {
      std::fprintf(stderr, "kiln_bench_ref_kernels: error: %s: %s\n", p.label.c_str(), t.error().message().c_str());
      ++failed;
      continue;
    }
    char range[32];
    std::snprintf(range, sizeof range, "%.2f-%.2f", t->run_s.front() * 1e3, t->run_s.back() * 1e3);
    std::printf("%-26s %10.3f %6d %10.2f %17s %8.2f\n", p.label.c_str(), t->create_s * 1e3, runs, t->median() * 1e3,
                range, p.flops / t->median() / 1e9);
  }
  return failed ? 1 : 0;
}
