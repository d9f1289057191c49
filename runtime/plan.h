// Execution planning: for one graph and one concrete input-shape signature, every value's
// shape, which nodes must infer again at run time, each intermediate's place in one arena,
// and each node's kernel, chosen and prepared on concrete shapes. The Session builds one per
// signature and runs it; `kiln compile` builds one to record the kernels and memory plan in
// the artifact. Planning owns no tensor memory: the arena is only sized and laid out here.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "runtime/kernel.h"

namespace kiln {

/// Where the planned intermediates live in the arena, by liveness.
struct MemoryLayout {
  size_t arena_bytes = 0;       ///< the arena's size after reuse
  size_t unshared_bytes = 0;    ///< what the placed values would need without reuse
  std::vector<int64_t> offset;  ///< per value: byte offset in the arena, -1 when not placed
  std::vector<size_t> bytes;    ///< per value: bytes reserved (64-byte multiples), 0 when not placed
  size_t planned_values = 0;    ///< values placed in the arena
  size_t dynamic_values = 0;    ///< values allocated per run (graph outputs, data-dependent shapes)
};

/// A node's kernel in a plan: prepared, with its implementation's name, who declined before
/// it and why, and the scratch memory it asked for.
struct PlannedKernel {
  std::unique_ptr<Kernel> kernel;
  std::string name;
  std::vector<std::pair<std::string, std::string>> declined;
  size_t workspace_bytes = 0;
  CpuFeatures needs_isa;  ///< ISA features the implementation needs
};

struct ExecutionPlan {
  /// A copy of the graph with every type and shape the plan knows (concrete for the planned
  /// values); value and node indices are the original graph's.
  Graph bound;
  /// Data the inference computed ahead (shape arithmetic), per value; undefined elsewhere.
  std::vector<Tensor> known;
  /// Per node: its outputs' shapes depend on data (or the op has no inference), so it infers
  /// them again on each run, as does everything it feeds.
  std::vector<char> reinfer;
  /// Per value: the node that produces it and the last node that reads it (inputs or
  /// captures), -1 when none.
  std::vector<int32_t> first_use, last_use;
  MemoryLayout memory;
  /// Per node: a Reshape, Flatten, Squeeze, Unsqueeze or Identity whose output is its input's
  /// memory (both arena intermediates, the elements in the same order), so that running it is
  /// nothing at all; its input lives as long as the output is read.
  std::vector<char> views;
  /// Per node: its kernel writes output 0 over the input it named (Kernel::overwrites_input),
  /// which dies there: the two values are one place in the arena.
  std::vector<char> overwrites;
  /// Per node: a Concat whose inputs were computed in place, each into its part of the output
  /// (runtime/plan.cc), so that running it is nothing.
  std::vector<char> in_place;
  /// A graph output that in-place Concats made of values computed before it: its buffer is made
  /// when node `step` runs (the first to write a part), and each part (with every value sharing
  /// its memory) is a view of it at a byte offset.
  struct OutputParts {
    ValueId output;
    int32_t step;
    std::vector<std::pair<ValueId, size_t>> parts;
  };
  std::vector<OutputParts> output_parts;
  std::vector<PlannedKernel> kernels;  ///< per node
  size_t workspace_bytes = 0;          ///< the largest any kernel asked for
  /// The threads a run uses: the target's, or 1 when the whole graph is too little work to
  /// share (under kSerialFlops counted FLOPs and kSerialBytes of intermediates), where forking
  /// and joining the pool would cost more than it saves.
  int threads = 1;
};

inline constexpr int64_t kSerialFlops = 4'000'000;
inline constexpr size_t kSerialBytes = 1 << 20;

struct PlanOptions {
  const Target& target;
  const KernelRegistry& kernels;
  bool reference = false;  ///< every node on its reference kernel (the oracle)
  /// false: shapes, constants and memory only, no kernel chosen or prepared (`kernels` stays
  /// empty), for callers that only build kernel queries (max-autotune's probes).
  bool choose_kernels = true;
  /// Weights packed by earlier plans, which this plan's kernels take where they want the same
  /// layout and add to otherwise (a session's; null: each plan packs its own).
  PackedWeights* packed_weights = nullptr;
};

/// "output 0 'y'" for messages about a node's outputs.
std::string output_name(const Graph& g, const Node& n, size_t i);

/// What a KernelQuery for node `n` sees of its operands in `plan`: each input's type, shape and
/// data (constants, and shape arithmetic the plan folded), each output's type and shape.
void node_query_operands(const ExecutionPlan& plan, size_t n, std::vector<InferInput>& inputs, std::vector<InferOutput>& outputs);

/// Plans `graph` for inputs of these concrete shapes (in graph.inputs order; the caller has
/// checked them against the declared shapes). Kernels are created with references to `graph`'s
/// nodes, so the graph must outlive the plan's kernels.
Result<ExecutionPlan> build_plan(const Graph& graph, std::span<const std::vector<int64_t>> input_shapes,
                                 const PlanOptions& options);

}  // namespace kiln
