// Helpers shared by the quant family's reference kernels (runtime/ref/quant*.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "runtime/kernel.h"

namespace kiln {

/// Registers MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv (runtime/ref/quant_integer.cc).
void register_ref_quant_integer(KernelRegistry& r);

namespace quant_ref {

/// Maps a flat element index of x to the index of its scale / zero point: per tensor, per axis
/// (a 1-D parameter along `axis`) or blocked (`block_size` consecutive elements along `axis`
/// share one parameter), from the node's axis and block_size attributes.
struct ParamIndex {
  int mode = 0;  ///< 0 per tensor, 1 per axis, 2 blocked
  int64_t inner = 1, axis_dim = 1, block = 1, nblocks = 1;

  /// Validates p against x (user error naming the node when they do not fit).
  static Result<ParamIndex> make(const KernelContext& ctx, const Tensor& x, const Tensor& p);

  int64_t operator()(int64_t i) const {
    if (mode == 0) return 0;
    int64_t a = (i / inner) % axis_dim;
    if (mode == 1) return a;
    int64_t outer = i / (inner * axis_dim);
    return (outer * nblocks + a / block) * inner + i % inner;
  }
};

/// round_half_even(v) + zero_point, saturated to Q's range (NaN maps to the zero point).
template <class Q>
Q saturate_round(double v, int64_t zero_point) {
  constexpr double lo = static_cast<double>(std::numeric_limits<Q>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<Q>::max());
  double r = std::isnan(v) ? 0.0 : std::nearbyint(v);
  r += static_cast<double>(zero_point);
  return static_cast<Q>(r < lo ? lo : r > hi ? hi : r);
}

}  // namespace quant_ref

}  // namespace kiln
