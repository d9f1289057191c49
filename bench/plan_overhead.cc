// Per-node cost of the planned executor: a chain of small elementwise nodes (Relu, Add of a
// constant, Mul by a constant, in turn) over a one-element and a 64-element tensor, run through
// kiln::Session as `kiln run` does. The per-node figure is the run's median over the node count:
// it holds the executor's work per node (binding, the kernel call, releasing) and the kernel's
// own work on 1 or 64 floats, so it is an upper bound on the executor's overhead. The same runs
// inside `kiln profile`'s measure (its recorder timing every node), interleaved in blocks of 10
// with the plain ones, give what profiling costs per node: the difference of the two figures.
//
//   kiln_bench_plan_overhead [--nodes N] [--runs N] [--warmup N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "profile/profiler.h"
#include "profile/stats.h"
#include "runtime/session.h"

namespace {

kiln::Model chain(int nodes, int64_t width) {
  kiln::Model m;
  kiln::Graph& g = m.graph;
  const kiln::Shape shape = kiln::Shape::of(std::vector<int64_t>{width});
  kiln::ValueId prev = g.add_value("x", kiln::DType::f32, shape);
  g.inputs = {prev};
  kiln::ValueId one = g.add_constant("one", kiln::Tensor::from<float>({1}, {1.0f}));
  kiln::ValueId half = g.add_constant("half", kiln::Tensor::from<float>({1}, {0.5f}));
  static const char* kOps[] = {"Relu", "Add", "Mul"};
  for (int i = 0; i < nodes; ++i) {
    const std::string index = std::to_string(i);  // (GCC 12 warns on "v" + std::to_string(i))
    kiln::ValueId next = g.add_value("v" + index, kiln::DType::f32, shape);
    const std::string op = kOps[i % 3];
    std::vector<kiln::ValueId> in = {prev};
    if (op == "Add") in.push_back(one);
    if (op == "Mul") in.push_back(half);
    g.add_node(kiln::Node{.name = "n" + index, .op = op, .inputs = in, .outputs = {next}});
    prev = next;
  }
  g.outputs = {prev};
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 2000, runs = 200, warmup = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view flag = argv[i];
    int value = std::atoi(argv[i + 1]);
    if (flag == "--nodes") nodes = value;
    else if (flag == "--runs") runs = value;
    else if (flag == "--warmup") warmup = value;
    else {
      std::fprintf(stderr, "usage: kiln_bench_plan_overhead [--nodes N] [--runs N] [--warmup N]\n");
      return 2;
    }
  }
  if (nodes < 1 || runs < 1 || warmup < 0) {
    std::fprintf(stderr, "kiln_bench_plan_overhead: --nodes and --runs must be positive\n");
    return 2;
  }
  std::printf("%-10s %8s %12s %12s %12s %14s %14s %14s\n", "elements", "nodes", "plan ms", "median us", "spread us",
              "ns per node", "profiled ns", "profiling ns");
  for (int64_t width : {int64_t{1}, int64_t{64}}) {
    kiln::Model m = chain(nodes, width);
    auto session = kiln::Session::create(m);
    if (!session.ok()) {
      std::fprintf(stderr, "kiln_bench_plan_overhead: %s\n", session.error().message().c_str());
      return 1;
    }
    std::vector<kiln::Tensor> inputs = {kiln::Tensor(kiln::DType::f32, {width})};
    std::fill_n(inputs[0].data<float>(), width, 0.25f);
    using clock = std::chrono::steady_clock;
    std::vector<double> us, profiled_us;
    double plan_ms = 0;
    for (int i = 0; i < warmup; ++i) {
      auto t0 = clock::now();
      auto out = (*session)->run(inputs);
      auto t1 = clock::now();
      if (!out.ok()) {
        std::fprintf(stderr, "kiln_bench_plan_overhead: %s\n", out.error().message().c_str());
        return 1;
      }
      // The first run builds the plan for this input shape.
      if (i == 0) plan_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    }
    kiln::profile::RunOptions profiled;
    profiled.warmup = 0;
    profiled.iterations = 10;
    while (static_cast<int>(us.size()) < runs) {
      for (int i = 0; i < 10; ++i) {
        auto t0 = clock::now();
        if (!(*session)->run(inputs).ok()) return 1;
        us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
      }
      auto measured = kiln::profile::measure(**session, inputs, profiled);
      if (!measured.ok()) return 1;
      for (double ms : measured->iteration_ms) profiled_us.push_back(ms * 1e3);
    }
    std::sort(us.begin(), us.end());
    const double med = kiln::profile::median(us), profiled_med = kiln::profile::median(profiled_us);
    // Spread: the middle half of the runs (25th to 75th percentile).
    const double spread = us[us.size() * 3 / 4] - us[us.size() / 4];
    std::printf("%-10lld %8d %12.2f %12.1f %12.1f %14.1f %14.1f %14.1f\n", static_cast<long long>(width), nodes, plan_ms, med,
                spread, med * 1000.0 / nodes, profiled_med * 1000.0 / nodes, (profiled_med - med) * 1000.0 / nodes);
  }
  return 0;
}
