// Type and shape inference over a whole graph, by running each node's op inference in order.
// Export runs it with symbolic input shapes; the runtime runs it on a copy of the graph with
// the bound input shapes to plan memory.
#pragma once

#include <vector>

#include "formats/ir.h"

namespace kiln {

struct InferOptions {
  /// Replace stored shapes rather than merging with them (the runtime's bound-shape pass).
  bool overwrite = false;
  /// When set, filled per node: whether its inference wanted input data it did not have, so
  /// that its outputs may depend on data (the runtime infers such nodes again on each run).
  std::vector<char>* needs_data = nullptr;
};

/// Infers every node's outputs in topological order and stores them in the graph's values.
/// A dim the inference leaves unknown keeps the value's stored dim. A known dim that
/// contradicts a stored known dim is an error naming the value. Nodes of ops outside the core
/// set (custom domains) leave their outputs as they are. Returns the data of values the
/// inference could compute (shape arithmetic), indexed by ValueId; undefined Tensors elsewhere.
Result<std::vector<Tensor>> infer_graph(Graph& graph, const InferOptions& options = {});

/// Infers one node (graph.nodes[index]) and stores its outputs' types and shapes; `known` holds
/// data computed so far by inference (grown to the graph's value count as needed).
Status infer_node_into(Graph& graph, size_t index, std::vector<Tensor>& known, const InferOptions& options = {});

}  // namespace kiln
