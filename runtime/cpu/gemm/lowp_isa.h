// What lowp.cc and the AVX-512 VNNI/BF16 build of the lower-precision kernels
// (lowp_avx512.cc) share.
#pragma once

#include <cstdint>

#include "runtime/cpu/gemm/lowp.h"

namespace kiln::cpu::gemm::lowp_avx512 {

/// u8s8: C's panels [p0, p1) (of NR columns, N in all) for all M rows, `mc` rows (a multiple of
/// MR) at a time; A's rows read in place (`lda` bytes apart), B is pack_b_s8's output.
void u8s8_panels(int64_t m, int64_t mc, int64_t p0, int64_t p1, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b,
                 const QuantEpilogue& ep, void* c, int64_t ldc, int64_t n);
/// u8s8: the end of the epilogue for `rows` rows of w real values (`ld` floats apart, changed
/// in place) where its activations do not apply on the registers (u8s8_on_registers): the
/// activation, the residual and the post activation over the block by the row kernels, then
/// stored in C's rows from i0, columns from n0, as f32 or requantized to u8 (ep.out_u8).
void u8s8_store(float* values, int64_t ld, int rows, int w, const QuantEpilogue& ep, void* c, int64_t ldc, int64_t i0, int64_t n0);

/// bf16: A's rows [m0, m0 + rows) as one MR-row panel of bf16 pairs (rows past `rows` zero).
void bf16_pack_a(const float* a, int64_t lda, int64_t m0, int64_t rows, int64_t k, uint16_t* out);
/// bf16: C's panels [p0, p1) for all M rows, `mc` at a time, A packed by bf16_pack_a panel after
/// panel, into `c` (rows `ldc` apart) or `parts` (gemm_bf16's).
void bf16_panels(int64_t m, int64_t mc, int64_t p0, int64_t p1, int64_t k, const uint16_t* a_packed, const uint16_t* b, const Epilogue& ep,
                 float* c, int64_t ldc, std::span<const ColumnPart> parts, int64_t n);

/// The column sums of `panels` of pack_b_s8's panels over k4 groups of 4 steps (vpdpbusd by
/// ones), into col_sums[panel · NR + column] for the n columns.
void s8_column_sums(const int8_t* packed, int64_t panels, int64_t k4, int64_t n, int32_t* col_sums);

/// pack_b_f16_from_panels: f32 panels of kF16Tile.nr columns to pack_b_f16's f16 pairs (by
/// vcvtps2ph, rounded to nearest even as half() rounds).
void pair_f16(const float* panels, int64_t k, int64_t n, uint16_t* out);

}  // namespace kiln::cpu::gemm::lowp_avx512

// The AMX build (lowp_amx.cc).
namespace kiln::cpu::gemm::lowp_amx {

/// u8s8 on AMX tiles: C's column tiles [t0, t1) (16 columns each, of pack_b_s8's panels; N in
/// all) for rows [0, m) (a multiple of 16), in groups of `nc` column tiles (even): each group
/// passes every 32 rows of A; A's rows read in place (`lda` bytes apart), C's first `real` of
/// them written (A's rows past those are padding). Loads the tile configuration on the calling
/// thread and releases it.
void u8s8_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b,
                const QuantEpilogue& ep, void* c, int64_t ldc, int64_t n, int64_t real);
/// `rows` rows of n bf16 values (`ldx` apart) copied to rows `ldo` apart (a multiple of 32),
/// zeros past n and in the rows after them up to `rows_pad`: A's copy for the tiles.
void copy_bf16_rows(const uint16_t* x, int64_t ldx, int64_t rows, int64_t n, uint16_t* out, int64_t ldo, int64_t rows_pad);
/// bf16 on AMX tiles: C's column tiles [t0, t1) (of pack_b_bf16's panels) for rows [0, m),
/// in groups of `nc` column tiles as u8s8_tiles; A is bf16, rows `lda` elements apart (a
/// multiple of 32, zeros past K), zero rows after the m-th up to a multiple of 16; then bias
/// and the epilogue as in the f32 GEMM, into `c` (rows `ldc` apart; f32, or bf16 rounded from
/// the f32 values where `c_bf16`, then the residual may be bf16: `z16`, rows ep.ldz apart, in
/// place of ep.z) or, from C's row `row0`, `parts` (gemm_bf16's; f32).
void bf16_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                const Epilogue& ep, const uint16_t* z16, void* c, bool c_bf16, int64_t ldc, std::span<const ColumnPart> parts, int64_t row0,
                int64_t n);

}  // namespace kiln::cpu::gemm::lowp_amx

// The AVX512-FP16 build (f16_avx512.cc).
namespace kiln::cpu::gemm::f16_avx512 {

/// A's rows [m0, m0 + rows) as f16, rows of ceil(K / 2) 32-bit words (pairs of steps; a zero
/// past an odd K) from `out`.
void pack_a(const float* a, int64_t lda, int64_t m0, int64_t rows, int64_t k, uint32_t* out);
/// The same for A gathered from the image `x` (an implicit im2col): rows [m0, m0 + rows) of
/// `g`'s windows, K = g.k().
void pack_windows(const ImageWindows& g, const float* x, int64_t m0, int64_t rows, uint32_t* out);
/// C's panels [p0, p1) (of 64 columns, N in all) for all M rows, `mc` at a time, `kc` steps of K
/// at a time (a multiple of 2·kF16Block; the partial sums kept in C), A's rows copied by pack_a
/// or pack_windows, into C's rows from `row0` on: `c` (rows `ldc` apart) or `parts`.
void panels(int64_t m, int64_t mc, int64_t kc, int64_t p0, int64_t p1, int64_t k, const uint32_t* a_packed, const uint16_t* b,
            const Epilogue& ep, float* c, int64_t ldc, std::span<const ColumnPart> parts, int64_t row0, int64_t n);

}  // namespace kiln::cpu::gemm::f16_avx512
