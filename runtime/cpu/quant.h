// What kiln's QMul kernel (quant.cc) takes, for compile's lower_int8 to ask before it makes one.
#pragma once

#include <cstdint>
#include <optional>

#include "formats/ir.h"

namespace kiln::cpu {

/// How QMul's f32 b meets its a (of y's shape): `rows` rows of c values in each of `images`,
/// scaled by that image's row of b (a channel gate: b [N or 1, 1.., C], a squeeze-excite
/// block's scales), or b of a's shape (one row of all the values).
struct QMulShape {
  int64_t images = 1, rows = 1, c = 1;
  bool gate = false;
};

/// a's and b's shapes as QMul's kernel runs them, or nullopt when it does not take them (either
/// not concrete, or b broadcast otherwise).
std::optional<QMulShape> qmul_shape(const Shape& a, const Shape& b);

}  // namespace kiln::cpu
