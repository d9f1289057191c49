// Small graph edits the passes share, on top of Graph's own editing API (formats/ir.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"
#include "formats/status.h"

namespace kiln {

/// Removes the nodes marked in `drop` (one flag per node), keeping the others in order. Their
/// output values stay; drop_unused_values removes the ones nothing refers to any more.
void erase_nodes(Graph& graph, const std::vector<char>& drop);

/// Removes values nothing refers to: not a graph input, output or capture, produced by no node,
/// read by no node input and captured by no node. Renumbers the rest; returns how many went.
size_t drop_unused_values(Graph& graph);

/// How many places read each value: node inputs, nodes whose subgraphs capture it, and graph outputs
/// (a graph output is a reader that no rewrite may take away).
std::vector<size_t> reader_counts(const Graph& graph);

/// The graph inputs' concrete shapes, in order, into `shapes`; when an input's shape is not
/// concrete, says which and what it is ("input 'x' has shape batchx4") instead.
std::optional<std::string> concrete_input_shapes(const Graph& graph, std::vector<std::vector<int64_t>>& shapes);

/// Runs `nodes` (indices into graph.nodes, in graph order) once on the reference kernels and
/// returns the values `outputs` (outputs of those nodes). Every input of the nodes that none of
/// them produces must be a constant: the nodes are a pure function of constants (kiln's core
/// ops are pure), computed now instead of on every run.
Result<std::vector<Tensor>> evaluate_nodes(const Graph& graph, const std::vector<size_t>& nodes,
                                           const std::vector<ValueId>& outputs);

/// The nodes `value` is computed from, in graph order, when it depends on constants alone (no
/// graph input, no subgraph, only core ops); nullopt otherwise, and for a constant.
std::optional<std::vector<size_t>> constant_cone(const Graph& graph, ValueId value);

/// Folds every DequantizeLinear whose inputs are all constants (a quantized model's weights)
/// into an f32 constant; returns how many. The weights run as float then, on the fast kernels.
Result<size_t> fold_constant_dequantize(Graph& graph);

/// Folds the weights of Conv, ConvTranspose, MatMul and Gemm (input 1) that are computed from
/// constants alone into constants, and drops the nodes that computed only them; returns how many
/// weights. GPT-2's tied LM head reads Transpose(wte): folded, a quantizer sees its weight as the
/// constant it is (ONNX Runtime's quantization pre-processing folds it too). A weight whose
/// reference kernel refuses its constants is left for run time to report.
Result<size_t> fold_computed_weights(Graph& graph);

/// Whether input `slot` of n is a constant of one element.
bool is_scalar_constant(const Graph& graph, const Node& n, size_t slot);

/// A per-tensor `op` (QuantizeLinear or DequantizeLinear) to f32 or from it: its scale (f32)
/// and zero point are scalar constants.
bool per_tensor(const Graph& graph, const Node& n, std::string_view op);

/// A human plural: "1 node", "3 nodes".
std::string count_of(size_t n, const char* singular, const char* plural);

}  // namespace kiln
