// What kiln's own int8 convolution kernels (kiln.qdwconv_u8s8_avx512's depthwise one,
// kiln.qconv_direct_u8s8_avx512's over an image's first layer) share: the convolutions they
// take, and the requantization of their sums into y's codes.
#pragma once

#include <algorithm>

#include "runtime/cpu/gemm/lowp.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

/// Why a QFusedConv is not one either kernel runs, by what they share: a CPU with VNNI,
/// channels-last, 2-D, not empty, every input but X and its residual Z a constant and every
/// shape concrete, no residual (but a u8 one where `residual`), u8 in and out, the weights'
/// zero points 0, no dilation, equal strides, ReLU, Clip, SiLU or no activation, and no post
/// activation (but a ReLU after a residual).
inline std::optional<std::string> u8_conv_declines(const KernelQuery& q, bool residual = false) {
  if (auto why = gemm::lowp_lacks(q.target.cpu, gemm::Lowp::u8s8)) return why;
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const InferInput& in = q.inputs[i];
    if (in.dtype == DType::undefined) continue;
    if (!in.shape.is_concrete()) return "input " + std::to_string(i) + " has no concrete shape";
    if (i != 0 && i != 9 && !in.value) return "input " + std::to_string(i) + " is computed at run time";
  }
  const bool has_z = q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined;
  if (has_z && (!residual || q.inputs[9].dtype != DType::u8)) return residual ? "a residual not u8" : "a residual";
  if (q.inputs[0].dtype != DType::u8 || q.outputs[0].dtype != DType::u8) return "not u8 in and out";
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[3].shape.concrete();
  if (xs.size() != 4 || ws.size() != 4) return "not 2-D";
  if (shape_numel(xs) == 0 || ws[0] == 0) return "an empty input or output";
  for (double z : q.inputs[5].value->to_double_vector())
    if (z != 0) return "the weights' zero points are not all zero";
  for (int64_t d : q.node.attr_ints("dilations"))
    if (d != 1) return "dilated";
  const std::vector<int64_t> strides = q.node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1] || strides[0] < 1) return "unequal strides";
  const Result<ActivationSpec> act = read_activation(q.node, "activation"), post = read_activation(q.node, "post_activation");
  if (!act.ok() || !post.ok()) return "an activation it does not read";
  if (post->kind != Activation::none && !(has_z && post->kind == Activation::relu)) return "a post activation (but a ReLU after a residual)";
  const Activation k = act->kind;
  if (k != Activation::none && k != Activation::relu && k != Activation::clip && k != Activation::silu) return "an activation other than ReLU, Clip or SiLU";
  return std::nullopt;
}

/// A value into y's codes (u8_conv_declines accepted the node): · inv + zero, after the SiLU
/// where `silu`, clamped to [lo, hi] before rounding: `lo` and `hi` as given, narrowed by a
/// ReLU's or Clip's bounds in codes (requantizing is monotonic, so clamping the value and then
/// requantizing is clamping its code to theirs).
struct Requantize {
  bool silu = false;
  float inv = 1, zero = 0, lo = 0, hi = 255;
};
inline Result<Requantize> requantize(const KernelQuery& q, float lo, float hi) {
  KILN_ASSIGN_OR_RETURN(const ActivationSpec act, read_activation(q.node, "activation"));
  Requantize r{.silu = act.kind == Activation::silu,
               .inv = 1.f / constant_scalar(q.inputs[6]),
               .zero = static_cast<float>(constant_zero_point(q.inputs[7])),
               .lo = lo,
               .hi = hi};
  if (act.kind == Activation::relu) r.lo = std::max(r.lo, r.zero);
  if (act.kind == Activation::clip) r.lo = std::max(r.lo, act.a * r.inv + r.zero), r.hi = std::min(r.hi, act.b * r.inv + r.zero);
  r.hi = std::max(r.hi, r.lo);
  return r;
}

/// Whether kiln.qconv_direct_u8s8_avx512 runs a QFusedConv by the default rule (it accepts it
/// and does not defer it): kiln.qconv_windows_u8s8_avx512, registered before it, then leaves
/// it to it.
bool qconv_direct_takes(const KernelQuery& q);

}  // namespace kiln::cpu
