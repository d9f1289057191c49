// The u8·s8 and bf16 GEMMs on AMX tiles (lowp_isa.h), built with AMX-TILE, AMX-INT8, AMX-BF16,
// AVX512-VNNI and AVX512-BF16 (CMake sets the flags for this file); lowp.cc calls them only on
// CPUs that have them and whose operating system granted the tile state (CpuFeatures::amx).
//
// B is pack_b_s8's or pack_b_bf16's: in each panel of NR = 48 columns, K's groups (4 u8 steps
// or a pair of bf16 ones: 4 bytes a column) one after another, NR × 4 bytes each. Sixteen
// columns of sixteen groups are then one tile of B as `tdpbusd` / `tdpbf16ps` read it (16 rows
// of 64 bytes, a group for each of 16 columns), at a stride of NR × 4 bytes, so the vector
// kernels' packed weights serve both. A's rows (u8 read in place; bf16 from a rounded copy)
// give a tile of 16 rows × 64 bytes per 64 u8 or 32 bf16 steps. Each block keeps R×C (≤ 2×2)
// tiles of 16×16 32-bit sums in tile registers 0-3, A's R row tiles in 4-5 and B's C column
// tiles in 6-7: per tile of K it loads R + C tiles and issues R·C products. Steps past the
// last whole tile of K are added with `vpdpbusd` / `vdpbf16ps` once the sums are stored. B's
// column tiles go in groups that fill half of L2 (lowp.cc picks `nc`), each group passing every
// 32 rows of A, whose two tiles stay in L1 meanwhile, so that C is written along its rows.
#include <immintrin.h>

#include <algorithm>

#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::lowp_amx {

namespace {

constexpr int64_t NR = kLowpTile.nr;
constexpr int64_t kGroupBytes = NR * 4;  // a group of 4 steps of a panel's NR columns
constexpr int64_t kLd = 32;              // columns of a block's sums as stored (two tiles)

__mmask16 mask(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1); }

// Tile d += tile a · tile b: u8 · s8 summed in s32, or bf16 pairs summed in f32. A macro: GCC's
// tile intrinsics spell their tile numbers into the instruction's text, so they must be literal.
#define KILN_TILE_PRODUCT(T, d, a, b)        \
  if constexpr (T == Lowp::u8s8) {           \
    _tile_dpbusd(d, a, b);                   \
  } else {                                   \
    _tile_dpbf16ps(d, a, b);                 \
  }

// sums[R·16 × C·16] (s32 or f32, kLd apart) = A's R·16 rows (`lda` bytes apart) · B's column
// tiles b0, b1 over `chunks` tiles of K (64 u8 steps, or 32 bf16 steps: 64 bytes of a row).
template <Lowp T, int R, int C>
void block(int64_t chunks, const uint8_t* a, int64_t lda, const uint8_t* b0, const uint8_t* b1, void* sums) {
  _tile_zero(0);
  if constexpr (C > 1) _tile_zero(1);
  if constexpr (R > 1) _tile_zero(2);
  if constexpr (R > 1 && C > 1) _tile_zero(3);
  const uint8_t* a1 = a + 16 * lda;
  for (int64_t s = 0; s < chunks; ++s) {
    const int64_t bo = s * 16 * kGroupBytes;
    _tile_loadd(6, b0 + bo, kGroupBytes);
    if constexpr (C > 1) _tile_loadd(7, b1 + bo, kGroupBytes);
    _tile_loadd(4, a + s * 64, lda);
    KILN_TILE_PRODUCT(T, 0, 4, 6)
    if constexpr (C > 1) { KILN_TILE_PRODUCT(T, 1, 4, 7) }
    if constexpr (R > 1) {
      _tile_loadd(5, a1 + s * 64, lda);
      KILN_TILE_PRODUCT(T, 2, 5, 6)
      if constexpr (C > 1) { KILN_TILE_PRODUCT(T, 3, 5, 7) }
    }
  }
  constexpr int64_t stride = kLd * 4;
  auto* out = static_cast<uint8_t*>(sums);
  _tile_stored(0, out, stride);
  if constexpr (C > 1) _tile_stored(1, out + 64, stride);
  if constexpr (R > 1) _tile_stored(2, out + 16 * stride, stride);
  if constexpr (R > 1 && C > 1) _tile_stored(3, out + 16 * stride + 64, stride);
}

#undef KILN_TILE_PRODUCT

using BlockFn = void (*)(int64_t, const uint8_t*, int64_t, const uint8_t*, const uint8_t*, void*);
template <Lowp T>
constexpr BlockFn kBlocks[2][2] = {{&block<T, 1, 1>, &block<T, 1, 2>}, {&block<T, 2, 1>, &block<T, 2, 2>}};

// Column tile t of B (pack_b_s8's or pack_b_bf16's; both have 4-byte groups of NR columns).
const uint8_t* column_tile(const void* b, int64_t panel_bytes, int64_t t) {
  constexpr int64_t per_panel = NR / 16;
  return static_cast<const uint8_t*>(b) + (t / per_panel) * panel_bytes + (t % per_panel) * 64;
}

}  // namespace

void u8s8_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b,
                const QuantEpilogue& ep, void* c, int64_t ldc, int64_t n) {
  amx::configure();
  const int64_t k4 = (k + 3) / 4, chunks = k / 64, panel_bytes = k4 * kGroupBytes;
  const __m512i a_zero = _mm512_set1_epi32(ep.a_zero);
  alignas(64) int32_t sums[32 * kLd];
  alignas(64) float values[32 * kLd];
  for (int64_t tg = t0; tg < t1; tg += nc)  // a group of B's column tiles stays in L2
    for (int64_t i0 = 0; i0 < m; i0 += 32)    // A's two tiles of rows stay in L1 as it passes
    for (int64_t t = tg; t < std::min(t1, tg + nc); t += 2) {
      const int cols = static_cast<int>(std::min<int64_t>(2, t1 - t));
      const int64_t n0 = t * 16;
      const int w = static_cast<int>(std::min<int64_t>(16 * cols, n - n0));
      const uint8_t* bt[2] = {column_tile(b, panel_bytes, t), cols > 1 ? column_tile(b, panel_bytes, t + 1) : nullptr};
      // Per column: what A's zero point adds to the sum (a_zero · Σb), the scale and the bias.
      __m512i comp[2];
      __m512 scale[2], bias[2];
      for (int j = 0; j < cols; ++j) {
        const __mmask16 mk = mask(w - j * 16);
        comp[j] = _mm512_mullo_epi32(a_zero, _mm512_maskz_loadu_epi32(mk, ep.col_sums + n0 + j * 16));
        scale[j] = _mm512_maskz_loadu_ps(mk, ep.scale + n0 + j * 16);
        bias[j] = ep.bias ? _mm512_maskz_loadu_ps(mk, ep.bias + n0 + j * 16) : _mm512_setzero_ps();
      }
      const int rt = m - i0 >= 32 ? 2 : 1, rows = 16 * rt;
      const uint8_t* ar = a + i0 * lda;
      kBlocks<Lowp::u8s8>[rt - 1][cols - 1](chunks, ar, lda, bt[0], bt[1], sums);
      for (int i = 0; i < rows; ++i) {
        __m512i acc[2];
        for (int j = 0; j < cols; ++j) acc[j] = _mm512_load_si512(sums + i * kLd + j * 16);
        // The steps past the tiles' whole 64s; a last group shorter than 4 loaded masked (B
        // is zero past K, and no byte past A's row is read).
        for (int64_t g = chunks * 16; g < k4; ++g) {
          const uint8_t* ag = ar + i * lda + g * 4;
          const __m128i group = g * 4 + 4 <= k ? _mm_loadu_si32(ag) : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << (k % 4)) - 1), ag);
          const __m512i av = _mm512_broadcastd_epi32(group);
          for (int j = 0; j < cols; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], av, _mm512_loadu_si512(bt[j] + g * kGroupBytes));
        }
        for (int j = 0; j < cols; ++j)
          _mm512_store_ps(values + i * kLd + j * 16,
                          _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[j], comp[j])), scale[j], bias[j]));
      }
      lowp_avx512::u8s8_store(values, kLd, rows, w, ep, c, ldc, i0, n0);
    }
  amx::release();
}

void bf16_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                const Epilogue& ep, float* c, int64_t ldc, int64_t n) {
  amx::configure();
  const RowKernels& rows_k = row_kernels(Isa::avx512);
  const int64_t k2 = (k + 1) / 2, chunks = k / 32, panel_bytes = k2 * kGroupBytes, ldb = lda * 2;
  const int64_t padded = (m + 15) / 16 * 16;  // A's copy has zero rows up to whole tiles
  alignas(64) float sums[32 * kLd];
  for (int64_t tg = t0; tg < t1; tg += nc)
    for (int64_t i0 = 0; i0 < padded; i0 += 32)
    for (int64_t t = tg; t < std::min(t1, tg + nc); t += 2) {
      const int cols = static_cast<int>(std::min<int64_t>(2, t1 - t));
      const int64_t n0 = t * 16;
      const int w = static_cast<int>(std::min<int64_t>(16 * cols, n - n0));
      const uint8_t* bt[2] = {column_tile(b, panel_bytes, t), cols > 1 ? column_tile(b, panel_bytes, t + 1) : nullptr};
      __m512 bias[2];
      for (int j = 0; j < cols; ++j) bias[j] = ep.bias ? _mm512_maskz_loadu_ps(mask(w - j * 16), ep.bias + n0 + j * 16) : _mm512_setzero_ps();
      const int rt = padded - i0 >= 32 ? 2 : 1;
      const int rows = static_cast<int>(std::min<int64_t>(16 * rt, m - i0));  // the real ones
      const uint16_t* ar = a + i0 * lda;
      kBlocks<Lowp::bf16>[rt - 1][cols - 1](chunks, reinterpret_cast<const uint8_t*>(ar), ldb, bt[0], bt[1], sums);
      for (int i = 0; i < rows; ++i) {
        __m512 acc[2];
        for (int j = 0; j < cols; ++j) acc[j] = _mm512_add_ps(_mm512_load_ps(sums + i * kLd + j * 16), bias[j]);
        // The pairs past the tiles' whole 32 steps (B and A's copy are zero past K).
        for (int64_t g = chunks * 16; g < k2; ++g) {
          const __m512bh av = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(ar + i * lda + g * 2));
          for (int j = 0; j < cols; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], av, (__m512bh)_mm512_loadu_si512(bt[j] + g * kGroupBytes));
        }
        for (int j = 0; j < cols; ++j) _mm512_mask_storeu_ps(c + (i0 + i) * ldc + n0 + j * 16, mask(w - j * 16), acc[j]);
      }
      if (ep.has_tail())
        rows_k.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, rows, w, ep.act, ep.post);
    }
  amx::release();
}

}  // namespace kiln::cpu::gemm::lowp_amx
