// kiln.dwconv_bf16_avx512's direct form (runtime/cpu/dwconv.cc): a channels-last 3x3 (stride 1
// or 2) or 5x5 (stride 2) depthwise convolution by a bf16 weight, X and Y each f32 or bf16, built with AVX512-BF16
// (dwconv_bf16_avx512.cc; CMake sets the flags for that file, and the kernel calls it only on
// CPUs that have them). Each output row reads its input rows where they lie, bringing 16
// channels of a pixel to f32 in the registers as it loads them (a bf16 one widened, an f32 one
// rounded to bf16's precision, as the products of a bf16 weight take it), sums the products in
// f32 against the widened filters, applies the activation on the registers and stores the row,
// a bf16 one rounded as it is stored (`vcvtneps2bf16`): no copy of either row.
#pragma once

#include <cstdint>

#include "formats/ops/epilogue.h"

namespace kiln::cpu::dwbf16 {

/// Channels a vector: the direct form takes channel counts that are a multiple of it.
inline constexpr int64_t kLanes = 16;

/// What the row kernel needs, set once by prepare.
struct Params {
  int64_t h = 0, w = 0, c = 0;    ///< x is an image [h, w, c]
  int64_t k = 3;                  ///< the filter's height and width: 3, or 5 (stride 2)
  int64_t s = 1, pt = 0, pl = 0;  ///< stride (1 or 2) and the top and left padding
  int64_t oh = 0, ow = 0;         ///< y is an image [oh, ow, c]
  bool x_bf16 = true, y_bf16 = true;  ///< else f32
  const float* filters = nullptr;  ///< [k, k, c], the bf16 weights widened
  ActivationSpec act;              ///< none, Relu, Clip or SiLU (takes_activation)
};

/// Whether the direct form applies `act` on its registers.
inline bool takes_activation(const ActivationSpec& act) {
  return act.kind == Activation::none || act.kind == Activation::relu || act.kind == Activation::clip || act.kind == Activation::silu;
}

/// Output rows [o0, o1) of one image: y (its [oh, ow, c]) from x (its [h, w, c]), the bias (c
/// values, or null) added to the sums before the activation.
void rows(const Params& p, const void* x, const float* bias, void* y, int64_t o0, int64_t o1);

}  // namespace kiln::cpu::dwbf16
