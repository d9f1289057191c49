// What woq.cc and the AVX-512 build of the weight-only-quantized kernels (woq_avx512.cc) share:
// the packed panel's layout and the kernels' entry points.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/cpu/gemm/woq.h"

namespace kiln::cpu::gemm::woq_avx512 {

/// B's panels are NR columns wide. The dequantizing micro-kernel's register tile is MR rows ×
/// HALF columns, half a panel: 24 accumulators, and a 4-bit K row's half is one 16-byte load.
inline constexpr int64_t NR = 64, HALF = 32, MR = 12;
/// The f32 GEMM's register tile that the dequantized slices feed (its panels NR wide too).
inline constexpr Tile kSliceTile{6, 64};

/// Bytes of one K row of a panel's codes: a byte per column, or a nibble for 4-bit codes (in
/// each 16 bytes, byte j holds column j in its low nibble and column j + 16 in its high one, so
/// that one widened load splits into two vectors of columns with an and and a shift).
inline int64_t row_bytes(WoqCodes codes) { return codes == WoqCodes::s8 || codes == WoqCodes::u8 ? NR : NR / 2; }
/// The groups of K that have a scale each (one when per column).
inline int64_t groups(int64_t k, int64_t group) { return group > 0 ? (k + group - 1) / group : 1; }
/// Bytes of a panel's codes, rounded up to 64 so that its scales start on a cache line.
inline int64_t codes_bytes(int64_t k, WoqCodes codes) { return (k * row_bytes(codes) + 63) / 64 * 64; }
/// Bytes of one panel: the codes, then per group NR scales and NR offsets (f32).
inline int64_t panel_bytes(int64_t k, int64_t group, WoqCodes codes) {
  return codes_bytes(k, codes) + groups(k, group) * 2 * NR * static_cast<int64_t>(sizeof(float));
}

/// C's rows [0, m) (`ldc` apart) and panels [p0, p1) of N columns, the dequantizing
/// micro-kernel MR rows × HALF columns at a time, then the epilogue on each MR×NR tile (the
/// residual starting at C's row 0); A's rows read in place, B packed by pack_b_woq.
void dequantizing_panels(int64_t m, int64_t p0, int64_t p1, int64_t n, int64_t k, int64_t group, const float* a,
                         int64_t lda, const std::byte* b, WoqCodes codes, const Epilogue& ep, float* c, int64_t ldc);

/// Rows [k0, k0 + kc) of one packed panel (of a B with K rows) dequantized into `out`, kc rows of
/// NR floats: the f32 GEMM's packed-B layout for NR = 64.
void dequantize(const std::byte* panel, WoqCodes codes, int64_t k, int64_t group, int64_t k0, int64_t kc, float* out);

}  // namespace kiln::cpu::gemm::woq_avx512
