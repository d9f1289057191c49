// The executor. One Session per model; run() may be called many times. The first run with a
// given input-shape signature builds an execution plan for it (see plan_for): each node's
// output shapes, its tensors' places in one arena sized by liveness, and which nodes must
// infer their outputs again at run time because the sizes depend on data (NonZero, Unique,
// shape operands computed from data). Later runs with that signature bind the inputs and call
// the kernels, nothing more. A compiled model's recorded input shapes are planned when the
// session is created.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "formats/serialize.h"
#include "runtime/kernel.h"

namespace kiln {

/// What an observer sees of one node: its place in the graph, the kernel that runs it, its
/// inputs (null for omitted optional ones) and its outputs (null for omitted ones; in
/// on_node_begin their buffers are allocated but not yet written when the shapes were known
/// ahead, and may be undefined for data-dependent ones).
struct NodeEvent {
  size_t index;  ///< position in graph.nodes
  const Node& node;
  std::string_view kernel;
  std::span<const Tensor* const> inputs;
  std::span<Tensor* const> outputs;
};

/// Hooks around each top-level node of a run (the profiler's timings, calibration's observers,
/// checks against the reference kernels). Nodes inside If/Loop/Scan bodies run within their
/// owner's begin/end. A session with no observer pays one predictable branch per node.
class ExecutionObserver {
 public:
  virtual ~ExecutionObserver() = default;
  virtual void on_node_begin(const NodeEvent&) {}
  virtual void on_node_end(const NodeEvent&) {}
};

/// How a node's kernel was chosen: the implementation that runs it and, before it, each one
/// that declined with its reason.
struct NodeKernel {
  std::string name;
  std::string label;  ///< Kernel::label(): the template instance, when the name does not say it all
  std::vector<std::pair<std::string, std::string>> declined;
  /// The node moves no data: a view of its input's memory, or a Concat whose inputs were
  /// computed in their parts of its output (ExecutionPlan::views, in_place).
  bool nothing_to_run = false;
};

struct SessionOptions {
  Target target;  ///< its thread count sizes kiln's one thread pool (runtime/threads.h)
  const KernelRegistry* kernels = nullptr;  ///< default_kernels() when null
  /// The oracle: every node on its reference kernel, whatever the model chose, and IEEE
  /// denormals (other runs flush them to zero).
  bool reference = false;
  /// The most subgraph executions (Loop/Scan iterations, If branches) one run() may make; 0 is
  /// no limit. A Loop runs as long as its data says (as ONNX Runtime does); fuzzing and other
  /// callers that must never hang set this.
  int64_t max_subgraph_runs = 0;
};

/// The memory plan of the last planned shape signature.
struct MemoryPlanStats {
  size_t arena_bytes = 0;       ///< bytes of the shared arena after reuse by liveness
  size_t unshared_bytes = 0;    ///< what the planned values would need without reuse
  size_t workspace_bytes = 0;   ///< the kernels' shared scratch memory (the largest any asked for)
  size_t planned_values = 0;    ///< intermediate values placed in the arena
  size_t dynamic_values = 0;    ///< values allocated one by one (data-dependent shapes, outputs)
  size_t reinferred_nodes = 0;  ///< nodes whose output shapes are inferred again on each run
  size_t signatures = 0;        ///< plans built so far (a signature planned again counts again)
  size_t cached_plans = 0;      ///< plans kept now, at most Session::kMaxCachedPlans
};

class Session {
 public:
  /// The most plans a session keeps, one per input-shape signature: past that, the least
  /// recently used is dropped (its arena freed) and planned again if its shapes return.
  static constexpr size_t kMaxCachedPlans = 8;

  /// Checks that every node has a kernel implementation and prepares the subgraphs' kernels;
  /// the top-level nodes' kernels are chosen and prepared per input-shape signature, on its
  /// first run, or here for the input shapes a compiled model records (its memory plan). The
  /// model must outlive the session.
  static Result<std::unique_ptr<Session>> create(const Model& model, SessionOptions options = {});
  ~Session();

  /// Runs with inputs in the order of graph.inputs; returns outputs in the order of
  /// graph.outputs. The outputs are the caller's: no later run writes into them. Not
  /// reentrant: one run at a time per session.
  Result<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);
  /// Runs with inputs by name; every graph input must be given.
  Result<std::vector<Tensor>> run(const std::map<std::string, Tensor>& inputs);

  /// Resolves the concrete shape of each graph input from the given arrays' shapes: checks
  /// ranks and known dims and binds symbolic dims (a symbol bound to two sizes is a user error).
  Result<std::map<std::string, int64_t>> bind_symbols(const std::vector<Tensor>& inputs) const;

  /// Observes the top-level nodes of the following runs; null detaches. Not owned.
  void set_observer(ExecutionObserver* observer) { observer_ = observer; }

  const MemoryPlanStats& memory_stats() const { return stats_; }
  /// The weights the session moved onto huge pages as it was created (weights_on_huge_pages).
  size_t huge_page_weight_bytes() const { return placed_.moved_bytes; }
  /// The weights it would have moved, had the machine given it huge pages quickly.
  size_t huge_page_eligible_bytes() const { return placed_.eligible_bytes; }
  /// The weights the plans' kernels packed while planning (or unpacked, a stored packed weight
  /// for a kernel that reads it plain; a model compiled with its input shapes stores them as
  /// its kernels read them), which every plan that wants them so shares: the forms, and their
  /// bytes.
  size_t packed_weight_forms() const { return packed_weights_.size(); }
  size_t packed_weight_bytes() const { return packed_weights_.bytes(); }
  /// The kernel of each node in the last run's plan, in node order (empty before a run).
  std::span<const NodeKernel> kernels() const;
  const Graph& graph() const { return graph_; }
  const Target& target() const { return options_.target; }
  /// The threads the last run used: the target's, or 1 for a graph too small to share
  /// (ExecutionPlan::threads); the target's before a run.
  int run_threads() const;

 private:
  struct Plan;
  struct Step;
  struct Workspace;
  struct Frame;
  class Context;
  Session(const Model& model, SessionOptions options, HugePageWeights placed);
  /// The plan for inputs of these shapes (graph.inputs order), built on first use.
  Result<Plan*> plan_for(std::vector<std::vector<int64_t>> key);
  Status run_planned(Plan& plan);
  Status run_step(const Step& step, Frame& frame, Plan& plan);
  Status execute(const Graph& graph, Frame& frame, const std::vector<std::unique_ptr<Kernel>>& kernels);
  Status infer_and_run(const Graph& graph, size_t index, Frame& frame, Kernel& kernel,
                       std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs,
                       std::span<std::byte> workspace);
  Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs, Frame& parent, const Node& owner);

  /// The model's graph with its lower-precision packed weights moved onto huge pages
  /// (weights_on_huge_pages), or a null graph: the session runs the model's own graph.
  HugePageWeights placed_;
  const Graph& graph_;
  SessionOptions options_;
  std::map<const Graph*, std::vector<std::unique_ptr<Kernel>>> subgraph_kernels_;
  std::unique_ptr<Workspace> subgraph_workspace_;
  /// The weights the plans' kernels packed, shared by every plan that wants them so (declared
  /// before the plans: the kernels let go of them first).
  PackedWeights packed_weights_;
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<Plan>> plans_;
  Plan* last_plan_ = nullptr;
  uint64_t runs_ = 0;     ///< plan_for calls, the clock of Plan::last_used
  size_t planned_ = 0;    ///< plans built
  MemoryPlanStats stats_;
  ExecutionObserver* observer_ = nullptr;
  int64_t subgraph_runs_ = 0;  ///< subgraph executions in the current run()
};

}  // namespace kiln
