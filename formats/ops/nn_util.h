// Sliding-window geometry shared by the nn family's inference (formats/ops/nn.cc) and its
// reference kernels (runtime/ref/nn_*.cc): Conv, ConvTranspose and the pools resolve auto_pad,
// ceil_mode and defaults in one place, so the shapes the executor allocates are the shapes the
// kernels fill.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "formats/status.h"

namespace kiln::nn {

/// Resolved attributes of a windowed op over `n` spatial dims; pads are begins then ends.
struct Window {
  std::vector<int64_t> kernel, strides, dilations, pads;
  std::vector<int64_t> out;  ///< output spatial sizes (-1 where the input size is unknown)
  size_t rank() const { return kernel.size(); }
};

/// Reads kernel_shape (or uses `kernel` when the op takes it from the weight), strides,
/// dilations, pads and auto_pad from `node` and computes the output sizes for input spatial
/// sizes `in` (-1 for unknown). `ceil_mode` rounds the output size up (pools only); the last
/// window must then start inside the input or its begin padding. Fails with a user error
/// naming the node on inconsistent attributes.
Result<Window> resolve_window(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel,
                              bool ceil_mode);

/// ConvTranspose geometry: output sizes and the pads actually applied, for input sizes `in`
/// (-1 for unknown) and the weight's kernel sizes.
Result<Window> resolve_transpose_window(const Node& node, const std::vector<int64_t>& in,
                                        std::vector<int64_t> kernel);

/// Resize geometry: per input dim, the output size and the scale used to map coordinates
/// (output / input when `sizes` is given).
struct ResizeGeometry {
  std::vector<int64_t> out;
  std::vector<double> scales;
  std::vector<int64_t> axes;  ///< the resized axes, in the order given (all dims by default)
};

/// Resolves Resize's output sizes from the `scales` or `sizes` input data (either may be null
/// or empty; exactly one must be present) and the axes / keep_aspect_ratio_policy attributes.
Result<ResizeGeometry> resolve_resize(const Node& node, const std::vector<int64_t>& in, const Tensor* scales,
                                      const Tensor* sizes);

/// A parsed Einsum equation. Labels are ints: letters keep ASCII order ('A'..'Z' = 0..25,
/// 'a'..'z' = 26..51); the dims an ellipsis covers are 52 + k, right-aligned across inputs.
struct EinsumSpec {
  std::vector<std::vector<int>> inputs;  ///< one label per input dim
  std::vector<int> output;               ///< one label per output dim
  int num_labels = 0;                    ///< labels are < num_labels
};

/// Parses `equation` for inputs of the given ranks (explicit "->" or implicit output).
Result<EinsumSpec> parse_einsum(const Node& node, const std::string& equation, const std::vector<int64_t>& ranks);

/// Channels-last layout: FusedConv and the pools with attribute channels_last = 1 read X (and
/// Z) and write Y as [N, spatial..., C] rather than [N, C, spatial...]; weights and bias keep
/// their layout. `kiln compile` introduces it where the library kernels run faster on it.
inline bool channels_last(const Node& node) { return node.attr_int("channels_last", 0) != 0; }
/// FusedConv with x_channels_first = 1 (and channels_last = 1): X stays [N, C, spatial...]
/// while Z and Y are channels-last (an image model's first layer reading the image as it comes).
inline bool x_channels_first(const Node& node) { return node.attr_int("x_channels_first", 0) != 0; }
/// FusedConv with int8_operands = 1: X and W are dequantized int8 codes that compile's lower_int8
/// left f32 (a target without int8 products, or a form its int8 kernels lack), so a
/// QuantizeLinear after it rounds sums of exact products; kernels keep those sums direct (no
/// Winograd transforms, whose fractions round them).
inline bool int8_operands(const Node& node) { return node.attr_int("int8_operands", 0) != 0; }
/// Whether input i of `node` is an activation whose layout channels_last sets: X (input 0, but
/// with x_channels_first), and the residual Z of FusedConv (input 3, and with x_parts X's other
/// parts after it) and QFusedConv (input 9).
inline bool layout_input(const Node& node, size_t i) {
  if (i == 0) return !x_channels_first(node);
  return (i >= 3 && node.op == "FusedConv") || (i == 9 && node.op == "QFusedConv");
}
/// PointwiseDepthwiseConv's stages as the FusedConv nodes they were (compile's
/// fuse_pointwise_depthwise): the pointwise one, when W1 is given, reads the node's inputs 0-2
/// (X, W1, B1) with its `pointwise_activation`; the depthwise one reads the pointwise one's
/// output (without W1, X) and the node's inputs 3-4 (W2, B2) with its window attributes, group
/// and `activation`; the projection one, when W3 is given, reads the depthwise one's output and
/// the node's inputs 5-7 (W3, B3, Z) with its `projection_activation`. All keep channels_last;
/// their input ids are the node's (the X of the depthwise and projection ones is kNoValue),
/// their one output kNoValue: views for inference and the reference kernels.
Node pointwise_stage(const Node& fused);
Node depthwise_stage(const Node& fused);
Node projection_stage(const Node& fused);
/// The permutation (Transpose's perm) [N, C, spatial...] -> [N, spatial..., C] of rank r.
std::vector<int64_t> channels_last_perm(size_t rank);
/// Its inverse, [N, spatial..., C] -> [N, C, spatial...].
std::vector<int64_t> channels_first_perm(size_t rank);
/// v permuted as Transpose permutes dims: out[i] = v[perm[i]].
template <class T>
std::vector<T> permute(const std::vector<T>& v, const std::vector<int64_t>& perm) {
  std::vector<T> out;
  out.reserve(perm.size());
  for (int64_t p : perm) out.push_back(v[static_cast<size_t>(p)]);
  return out;
}

}  // namespace kiln::nn
