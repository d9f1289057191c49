// What the linear-layer kernels (QFusedMatMul's, WoqFusedMatMul's, and the convolutions that
// are plain products) read off their query: A's rows M, and B's K and N from its 2-D shape
// ([K, N], or [N, K] with transB), or from a pointwise convolution's weight.
#pragma once

#include "runtime/kernel.h"

namespace kiln::cpu {

struct LinearDims {
  int64_t m = 0, n = 0, k = 0;
  bool trans = false;
};

/// The dims of a product of input 0 (A, any rank, its last dim K) by input `b` (B, 2-D); a user
/// error naming the node when A's last dim is not B's K. Shapes must be concrete.
inline Result<LinearDims> linear_dims(const KernelQuery& q, size_t b) {
  const std::vector<int64_t> as = q.inputs[0].shape.concrete(), bs = q.inputs[b].shape.concrete();
  LinearDims d;
  d.trans = q.node.attr_int("transB", 0) != 0;
  d.k = d.trans ? bs[1] : bs[0];
  d.n = d.trans ? bs[0] : bs[1];
  if (as.back() != d.k)
    return user_error(q.node.where(), "A's last dim " + std::to_string(as.back()) + " is not B's K " + std::to_string(d.k));
  d.m = d.k > 0 ? shape_numel(as) / d.k : 0;
  return d;
}

/// Why a convolution (its weight input `w`) is not a plain matrix product by its shape, if it
/// is one: channels-last, 1x1 kernel, stride 1 (any stride when `strided`: its
/// pixels gathered first), no padding, no dilation, no groups. Its [N, H, W, C] input is then
/// [N·H·W, C] rows and its weight [K, C, 1, 1] is Bᵀ.
inline std::optional<std::string> pointwise_shape_declines(const KernelQuery& q, size_t w, bool strided = false) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not 2-D";
  if (!q.inputs[w].shape.is_concrete()) return "the weight's shape is not known ahead";
  const std::vector<int64_t> ws = q.inputs[w].shape.concrete();
  if (ws.size() != 4 || ws[2] != 1 || ws[3] != 1 || q.node.attr_int("group", 1) != 1) return "not a 1x1 ungrouped convolution";
  for (int64_t v : q.node.attr_ints("dilations")) if (v != 1) return "dilations other than 1";
  for (int64_t v : q.node.attr_ints("strides")) if (v != 1 && !(strided && v > 1)) return "strides other than 1";
  for (int64_t v : q.node.attr_ints("pads")) if (v != 0) return "padding";
  if (const std::string pad = q.node.attr_string("auto_pad", "NOTSET"); pad != "NOTSET" && pad != "VALID") return "auto_pad";
  return std::nullopt;
}

/// pointwise_shape_declines, and the weight a constant (packed ahead).
inline std::optional<std::string> pointwise_declines(const KernelQuery& q, size_t w, bool strided = false) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not 2-D";
  if (!q.inputs[w].value) return "the weights are computed at run time";
  return pointwise_shape_declines(q, w, strided);
}

/// A stride-1 pointwise convolution's product (pointwise_declines accepts it): M the pixels, K
/// the input channels, N the output channels, its weight [N, K, 1, 1] read as Bᵀ.
inline Result<LinearDims> pointwise_dims(const KernelQuery& q, size_t w) {
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[w].shape.concrete();
  LinearDims d{.n = ws[0], .k = ws[1], .trans = true};
  if (xs.back() != d.k)
    return user_error(q.node.where(), "X's channels " + std::to_string(xs.back()) + " are not the weight's " + std::to_string(d.k));
  d.m = shape_numel(xs) / d.k;
  return d;
}

}  // namespace kiln::cpu
