// Flash attention's two products on AMX tiles (attention_amx.cc, built with AMX-BF16 and
// AVX512-BF16; attention.cc calls it only where the CPU has them): Q·Kᵀ and P·V with bf16
// operands and f32 sums, in 16-row tiles of 16 f32 columns over 32 bf16 steps.
//
// Operands, all padded with zeros to whole tiles:
// - A (the query rows, the probabilities): row-major bf16 rows, `lda` elements apart, their
//   steps a multiple of 32; rows a multiple of 16.
// - B (K and V, packed once per KV head): tiles of 16 pairs of steps × 16 columns × 2 (the
//   pairs AMX multiplies), 512 bf16 each. Kᵀ: for each group of 16 keys, the head's steps in
//   tiles of 32. V: for each chunk of 32 keys, its columns in tiles of 16.
#pragma once

#include <cstdint>

namespace kiln::cpu::amx {

/// bf16 elements in one tile of B.
inline constexpr int64_t kTile = 512;

/// The longest head QAttention's kernel takes (kiln.qattention_amx, which compile's lower_int8
/// lowers for): its Q·Kᵀ multiplies the codes less their zero points (integers of at most 255
/// in magnitude, exact in bf16), and a sum of up to 256 of their products stays below 2^24,
/// where f32 holds every integer. V's head must be whole tiles of 16 columns.
inline constexpr int64_t kQuantizedHeadMax = 256;

/// Loads the tile configuration (eight tiles of 16 rows of 64 bytes) on the calling thread:
/// these products' and the AMX GEMMs' (gemm/lowp_amx.cc).
void configure();
/// Releases the calling thread's tile state.
void release();

/// `rows` rows of n floats (`ldx` apart) rounded to bf16 (nearest even) into `out` (rows
/// `ldo` elements apart); columns [n, n_pad) and rows [rows, rows_pad) are zeros.
void to_bf16_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, uint16_t* out, int64_t ldo, int64_t n_pad, int64_t rows_pad);

/// n keys (rows of d floats, `ldk` apart; n ≤ 16) as the Kᵀ tiles of one group of 16 keys:
/// ceil(d / 32) tiles from `out`, zeros past n and past d.
void pack_key_group(const float* k, int64_t ldk, int64_t n, int64_t d, uint16_t* out);

/// n rows of V (`v[i]`, dv floats each; n ≤ 32, dv a multiple of 16) as one chunk of 32 keys:
/// dv / 16 tiles from `out`, zeros past n. The rows are pointers: a chunk may take its first
/// keys from the past values and the rest from the new ones.
void pack_value_rows(const float* const* v, int64_t n, int64_t dv, uint16_t* out);

/// `rows` rows of n floats (`ldx` apart; the softmax's probabilities) each as two bf16 rows
/// whose sum carries it to 16 bits: hi = x rounded (nearest even), lo = x − hi rounded, rows
/// `ldo` apart in `hi` and `lo`, zeros in columns [n, n_pad) (n_pad a multiple of 16).
void split_bf16_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, uint16_t* hi, uint16_t* lo, int64_t ldo, int64_t n_pad);

/// C[rows × 16·cols] (+)= A[rows × 32·chunks] · B: `rows` a multiple of 16 (A's rows two tiles
/// at a time), B's column of tiles j at `b + j·b_col`, its tiles of step chunk s `b_step`
/// elements apart; C f32, rows `ldc` apart, loaded first when `accumulate`.
void product(const uint16_t* a, int64_t lda, int64_t rows, int64_t chunks, const uint16_t* b, int64_t b_col, int64_t b_step,
             int64_t cols, float* c, int64_t ldc, bool accumulate);

}  // namespace kiln::cpu::amx
