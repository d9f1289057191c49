// What woq.cc and the AVX-512 and AVX512-VNNI builds of the weight-only-quantized kernels
// (woq_avx512.cc, woq_vnni.cc) share: the packed panel's layout, the layout of A split into
// 16-bit integers, and the kernels' entry points.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

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

namespace kiln::cpu::gemm::woq_vnni {

/// A's rows as two 16-bit integers a value (woq.h's kWoqABlock), as split_rows writes them into
/// the workspace: per row, K codes, K rests (int16 each; one more of each, 0, where K is odd: the
/// last pair reads it), then a scale and a sum of the f32 values
/// per block, each part on 64 bytes. Blocks are cut within each group (all of K when the scales
/// are per column), kWoqABlock values long but the group's last.
struct SplitA {
  SplitA(int64_t m, int64_t k, int64_t group) : m(m), k(k), group(group) {
    for_blocks([&](int64_t, int64_t, int64_t, int64_t) { ++blocks; });
  }
  /// f(k0, end, group index, block index) for each block, in K's order.
  template <typename F>
  void for_blocks(F&& f) const {
    const int64_t length = group > 0 ? group : std::max<int64_t>(k, 1);
    int64_t b = 0;
    for (int64_t g0 = 0, g = 0; g0 < k; g0 += length, ++g)
      for (int64_t k0 = g0; k0 < std::min(k, g0 + length); k0 += kWoqABlock) f(k0, std::min({k, g0 + length, k0 + kWoqABlock}), g, b++);
  }
  int64_t codes_bytes() const { return round64((k + 1) / 2 * 2 * 2); }
  int64_t floats_bytes() const { return round64(blocks * 4); }
  int64_t row_bytes() const { return 2 * codes_bytes() + 2 * floats_bytes(); }
  int64_t bytes() const { return m * row_bytes(); }
  /// Row i's parts in the workspace `ws` (const where `ws` is).
  template <typename B>
  auto codes(B* ws, int64_t i) const { return at<int16_t>(ws + i * row_bytes()); }
  template <typename B>
  auto rests(B* ws, int64_t i) const { return at<int16_t>(ws + i * row_bytes() + codes_bytes()); }
  template <typename B>
  auto scales(B* ws, int64_t i) const { return at<float>(ws + i * row_bytes() + 2 * codes_bytes()); }
  template <typename B>
  auto sums(B* ws, int64_t i) const { return scales(ws, i) + floats_bytes() / 4; }

  int64_t m, k, group, blocks = 0;

 private:
  static int64_t round64(int64_t x) { return (x + 63) / 64 * 64; }
  template <typename T, typename B>
  static auto at(B* p) {
    if constexpr (std::is_const_v<B>) return reinterpret_cast<const T*>(p);
    else return reinterpret_cast<T*>(p);
  }
};

/// A's m rows (`lda` floats apart) split into `out` (SplitA(m, k, group).bytes() long, 64-byte
/// aligned): per block, its scale s (largest |a| / 32767; NaN where a value is not finite), the
/// codes q = round(a / s), the rests round((a / s − q) · 2^15), and the sum of the f32 values.
void split_rows(int64_t m, int64_t k, int64_t group, const float* a, int64_t lda, std::byte* out);

/// C's rows [0, m) (`ldc` apart) and panels [p0, p1) of N columns from A split by split_rows
/// (`split`, its rows from 0) and B's codes packed by pack_b_woq, two rows at a time, then
/// the epilogue on each tile (the residual starting at C's row 0).
void split_panels(int64_t m, int64_t p0, int64_t p1, int64_t n, int64_t k, int64_t group, const std::byte* split,
                    const std::byte* b, WoqCodes codes, const Epilogue& ep, float* c, int64_t ldc);

}  // namespace kiln::cpu::gemm::woq_vnni
