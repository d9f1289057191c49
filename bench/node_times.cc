// Where a model's time goes: runs it through kiln::Session with an ExecutionObserver timing
// every node, and prints the totals per op and kernel, most expensive first, with the run's
// median and the sum of the node times (the difference is the executor's own work).
//
//   kiln_bench_node_times MODEL.kiln INPUTS.npz [--runs N] [--warmup N] [--threads T] [--top K]
//                          [--nodes K] [--without IMPL,IMPL...]
// --top: how many op/kernel rows (25); --nodes: also the K most expensive single nodes, with
// their output shapes (0); --without: run without these kernel implementations (the nodes a
// compiled model pinned to them choose again), to compare providers on the same model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "formats/npy.h"
#include "formats/serialize.h"
#include "runtime/session.h"
#include "runtime/threads.h"

namespace {

using clock_type = std::chrono::steady_clock;

class NodeTimer final : public kiln::ExecutionObserver {
 public:
  explicit NodeTimer(size_t nodes) : total_(nodes, 0.0) {}
  void on_node_begin(const kiln::NodeEvent&) override { start_ = clock_type::now(); }
  void on_node_end(const kiln::NodeEvent& e) override {
    total_[e.index] += std::chrono::duration<double>(clock_type::now() - start_).count();
  }
  const std::vector<double>& total() const { return total_; }

 private:
  std::vector<double> total_;
  clock_type::time_point start_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kiln_bench_node_times MODEL.kiln INPUTS.npz [--runs N] [--warmup N] [--threads T] [--top K] [--nodes K]\n");
    return 2;
  }
  int runs = 10, warmup = 2, threads = kiln::available_cores(), top = 25, nodes = 0;
  std::vector<std::string> without;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--without") {
      for (std::string list = argv[i + 1]; !list.empty();) {
        const size_t comma = list.find(',');
        without.push_back(list.substr(0, comma));
        list = comma == std::string::npos ? "" : list.substr(comma + 1);
      }
      continue;
    }
    int v = std::atoi(argv[i + 1]);
    if (flag == "--runs") runs = v;
    else if (flag == "--warmup") warmup = v;
    else if (flag == "--threads") threads = v;
    else if (flag == "--top") top = v;
    else if (flag == "--nodes") nodes = v;
  }
  auto model = kiln::load_model(argv[1]);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.error().message().c_str());
    return 1;
  }
  auto named = kiln::read_npz_file(argv[2]);
  if (!named.ok()) {
    std::fprintf(stderr, "%s\n", named.error().message().c_str());
    return 1;
  }
  std::map<std::string, kiln::Tensor> inputs(named->begin(), named->end());
  kiln::SessionOptions options;
  options.target.threads = threads;
  const kiln::KernelRegistry registry = kiln::default_kernels().without(without);
  if (!without.empty()) {
    options.kernels = &registry;
    for (kiln::Node& n : model->graph.nodes)
      if (std::find(without.begin(), without.end(), n.kernel.name) != without.end()) n.kernel = {};
  }
  auto session = kiln::Session::create(*model, options);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.error().message().c_str());
    return 1;
  }
  for (int i = 0; i < warmup; ++i)
    if (auto r = (*session)->run(inputs); !r.ok()) {
      std::fprintf(stderr, "%s\n", r.error().message().c_str());
      return 1;
    }
  const kiln::Graph& g = model->graph;
  NodeTimer timer(g.nodes.size());
  std::vector<double> run_s;
  for (int i = 0; i < runs; ++i) {
    (*session)->set_observer(&timer);
    auto t0 = clock_type::now();
    auto r = (*session)->run(inputs);
    run_s.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    if (!r.ok()) return 1;
  }
  std::sort(run_s.begin(), run_s.end());
  std::map<std::pair<std::string, std::string>, std::pair<double, int>> by_kind;
  auto kernels = (*session)->kernels();
  double sum = 0;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    auto& e = by_kind[{g.nodes[n].qualified_op(), n < kernels.size() ? kernels[n].name : "?"}];
    e.first += timer.total()[n] / runs;
    e.second += 1;
    sum += timer.total()[n] / runs;
  }
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [k, v] : by_kind)
    rows.emplace_back(v.first, k.first + " [" + k.second + "] x" + std::to_string(v.second));
  std::sort(rows.rbegin(), rows.rend());
  const kiln::MemoryPlanStats& mem = (*session)->memory_stats();
  std::printf("run median %.3f ms (observed, %d threads), node times sum %.3f ms; arena %zu bytes, workspace %zu bytes\n",
              run_s[run_s.size() / 2] * 1e3, threads, sum * 1e3, mem.arena_bytes, mem.workspace_bytes);
  for (int i = 0; i < top && i < static_cast<int>(rows.size()); ++i)
    std::printf("%9.3f ms %5.1f%%  %s\n", rows[static_cast<size_t>(i)].first * 1e3, 100 * rows[static_cast<size_t>(i)].first / sum,
                rows[static_cast<size_t>(i)].second.c_str());
  std::vector<std::pair<double, size_t>> single;
  for (size_t n = 0; n < g.nodes.size(); ++n) single.emplace_back(timer.total()[n] / runs, n);
  std::sort(single.rbegin(), single.rend());
  for (int i = 0; i < nodes && i < static_cast<int>(single.size()); ++i) {
    const kiln::Node& node = g.nodes[single[static_cast<size_t>(i)].second];
    const kiln::ValueId out = node.outputs.empty() ? kiln::kNoValue : node.outputs[0];
    std::printf("%9.3f ms  %s %s [%s] -> %s\n", single[static_cast<size_t>(i)].first * 1e3, node.name.c_str(),
                node.qualified_op().c_str(), kernels[single[static_cast<size_t>(i)].second].name.c_str(),
                out == kiln::kNoValue ? "-" : g.value(out).shape.str().c_str());
  }
  return 0;
}
