// Semantic verification of a Model: what must hold for every graph kiln loads, exports or
// writes after a pass, beyond what the FlatBuffers verifier checks.
#pragma once

#include "formats/ir.h"
#include "formats/status.h"

namespace kiln {

/// Checks the model's graph and all its subgraphs; returns the first problem as a user error
/// naming the value or node (subgraph problems are prefixed with the node and attribute that
/// hold the subgraph). It checks:
/// - value indices in range (node inputs and outputs, graph inputs and outputs; -1 only for an
///   omitted node input or output);
/// - every value has a name unique in its graph and a known dtype; a shape of unknown rank
///   lists no dims;
/// - each value is produced by at most one node; graph inputs are neither produced nor
///   constants; a constant is not produced by a node;
/// - every value a node reads or the graph returns has a source: a node, a graph input, a
///   constant, or (in a subgraph) a value of that name in an enclosing graph;
/// - the graph is acyclic;
/// - constant and tensor-attribute data agree with their dtype and shape (element count
///   without overflow, bytes present); a constant's dtype and shape agree with its value's;
/// - quantization parameters are consistent (integer storage, one scale per tensor or per
///   channel of `axis`, positive finite scales, zero points in the storage type's range);
/// - every core op (domain "") is in core_ops() and passes check_node_schema(); its inferred
///   output dtypes equal the stored ones and inferred known dims agree with stored known dims.
/// Ops of other domains are checked structurally only.
Status verify_model(const Model& model);

/// verify_model for one graph (and its subgraphs), for passes that rewrite a graph.
Status verify_graph(const Graph& graph);

}  // namespace kiln
