// The executor: binds inputs, plans memory per input-shape signature and runs each node's
// kernel in order. One Session per model; run() may be called many times.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "runtime/kernel.h"

namespace kiln {

struct SessionOptions {
  Target target;
  const KernelRegistry* kernels = nullptr;  ///< default_kernels() when null
  /// The most subgraph executions (Loop/Scan iterations, If branches) one run() may make; 0 is
  /// no limit. A Loop runs as long as its data says (as ONNX Runtime does); fuzzing and other
  /// callers that must never hang set this.
  int64_t max_subgraph_runs = 0;
};

/// The memory plan of the last run's shape signature.
struct MemoryPlanStats {
  size_t arena_bytes = 0;       ///< bytes of the shared arena after reuse by liveness
  size_t unshared_bytes = 0;    ///< what the planned values would need without reuse
  size_t planned_values = 0;    ///< intermediate values placed in the arena
  size_t dynamic_values = 0;    ///< values allocated one by one (data-dependent shapes, outputs)
  size_t signatures = 0;        ///< distinct input-shape signatures planned so far
};

class Session {
 public:
  /// Prepares a kernel for every node. The model must outlive the session.
  static Result<std::unique_ptr<Session>> create(const Model& model, SessionOptions options = {});
  ~Session();

  /// Runs with inputs in the order of graph.inputs; returns outputs in the order of graph.outputs.
  Result<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);
  /// Runs with inputs by name; every graph input must be given.
  Result<std::vector<Tensor>> run(const std::map<std::string, Tensor>& inputs);

  /// Resolves the concrete shape of each graph input from the given arrays' shapes: checks
  /// ranks and known dims and binds symbolic dims (a symbol bound to two sizes is a user error).
  Result<std::map<std::string, int64_t>> bind_symbols(const std::vector<Tensor>& inputs) const;

  const MemoryPlanStats& memory_stats() const { return stats_; }
  /// The implementation chosen for each node, in node order.
  const std::vector<std::string>& kernel_names() const { return kernel_names_; }
  const Graph& graph() const { return graph_; }

 private:
  struct Plan;
  struct Frame;
  class Context;
  Session(const Model& model, SessionOptions options);
  Result<const Plan*> plan_for(const std::vector<Tensor>& inputs);
  Status execute(const Graph& graph, Frame& frame, const std::vector<std::unique_ptr<Kernel>>& kernels,
                 const Plan* plan);
  Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs, Frame* parent);

  const Graph& graph_;
  SessionOptions options_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::string> kernel_names_;
  std::map<const Graph*, std::vector<std::unique_ptr<Kernel>>> subgraph_kernels_;
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<Plan>> plans_;
  MemoryPlanStats stats_;
  int64_t subgraph_runs_ = 0;  ///< subgraph executions in the current run()
};

}  // namespace kiln
