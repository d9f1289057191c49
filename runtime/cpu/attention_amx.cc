// Flash attention's products on AMX tiles (attention_amx.h), built with AMX-TILE, AMX-BF16 and
// AVX512-BF16 (CMake sets the flags for this file); attention.cc calls it only on CPUs that
// have them and whose operating system granted the tile state (CpuFeatures::amx).
//
// Each call of block<R, C> keeps an R×C block of 16×16 f32 tiles of C in tile registers 0-3,
// with A's R row tiles in 4-5 and B's C column tiles in 6-7: per chunk of 32 steps it loads
// R + C tiles and issues R·C `tdpbf16ps`, each 16·16·32 products summed in f32.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/transpose16.h"

namespace kiln::cpu::amx {

namespace {

// The 64-byte tile configuration `ldtilecfg` reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Eight tiles of 16 rows of 64 bytes. A constant: GCC 12 treats a local one's stores as dead,
// as if ldtilecfg read only its first byte.
constexpr TileConfig kConfig = {.colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

// 32 floats from x (n of them valid, the rest read as zeros) as 32 bf16 in order.
__m512i bf16_32(const float* x, int64_t n) {
  const __m512 lo = _mm512_maskz_loadu_ps(lanes16(n), x), hi = _mm512_maskz_loadu_ps(lanes16(n - 16), x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

template <int R, int C>
void block(const uint16_t* a, int64_t lda, int64_t chunks, const uint16_t* b0, const uint16_t* b1, int64_t b_step, float* c, int64_t ldc,
           bool accumulate) {
  const int64_t a_stride = lda * 2, c_stride = ldc * 4;
  float* c1 = c + 16 * ldc;
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    if constexpr (C > 1) _tile_loadd(1, c + 16, c_stride);
    if constexpr (R > 1) _tile_loadd(2, c1, c_stride);
    if constexpr (R > 1 && C > 1) _tile_loadd(3, c1 + 16, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (C > 1) _tile_zero(1);
    if constexpr (R > 1) _tile_zero(2);
    if constexpr (R > 1 && C > 1) _tile_zero(3);
  }
  for (int64_t s = 0; s < chunks; ++s) {
    _tile_loadd(6, b0 + s * b_step, 64);
    if constexpr (C > 1) _tile_loadd(7, b1 + s * b_step, 64);
    _tile_loadd(4, a + s * 32, a_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (C > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (R > 1) {
      _tile_loadd(5, a + 16 * lda + s * 32, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (C > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_stride);
  if constexpr (C > 1) _tile_stored(1, c + 16, c_stride);
  if constexpr (R > 1) _tile_stored(2, c1, c_stride);
  if constexpr (R > 1 && C > 1) _tile_stored(3, c1 + 16, c_stride);
}

template <int R>
void row_tiles(const uint16_t* a, int64_t lda, int64_t chunks, const uint16_t* b, int64_t b_col, int64_t b_step, int64_t cols, float* c,
               int64_t ldc, bool accumulate) {
  int64_t j = 0;
  for (; j + 1 < cols; j += 2)
    block<R, 2>(a, lda, chunks, b + j * b_col, b + (j + 1) * b_col, b_step, c + j * 16, ldc, accumulate);
  if (j < cols) block<R, 1>(a, lda, chunks, b + j * b_col, nullptr, b_step, c + j * 16, ldc, accumulate);
}

}  // namespace

void configure() { _tile_loadconfig(&kConfig); }

void release() { _tile_release(); }

void to_bf16_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, uint16_t* out, int64_t ldo, int64_t n_pad, int64_t rows_pad) {
  for (int64_t r = 0; r < rows_pad; ++r) {
    uint16_t* o = out + r * ldo;
    if (r >= rows) {
      std::memset(o, 0, static_cast<size_t>(n_pad) * sizeof(uint16_t));
      continue;
    }
    for (int64_t j = 0; j < n_pad; j += 32) _mm512_storeu_si512(o + j, bf16_32(x + r * ldx + j, n - j));
  }
}

void split_bf16_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, uint16_t* hi, uint16_t* lo, int64_t ldo, int64_t n_pad) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ldx;
    for (int64_t j = 0; j < n_pad; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(lanes16(n - j), row + j);
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
      const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * ldo + j), h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * ldo + j), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
    }
  }
}

void pack_key_group(const float* k, int64_t ldk, int64_t n, int64_t d, uint16_t* out) {
  // Word p of a key's chunk (its steps 2p and 2p + 1) goes to row p, column `key`, of the tile:
  // the 16 keys' words of a chunk, transposed. (Scattered word by word, the packing took a
  // fifth of BERT-base's bf16 attention.)
  const int64_t chunks = (d + 31) / 32;
  for (int64_t s = 0; s < chunks; ++s) {
    __m512 r[16];
    for (int64_t key = 0; key < 16; ++key)
      r[key] = key < n ? _mm512_castsi512_ps(bf16_32(k + key * ldk + s * 32, d - s * 32)) : _mm512_setzero_ps();
    transpose16x16(r);
    for (int p = 0; p < 16; ++p) _mm512_storeu_ps(reinterpret_cast<float*>(out + s * kTile + p * 32), r[p]);
  }
}

void pack_value_rows(const float* const* v, int64_t n, int64_t dv, uint16_t* out) {
  // Row p of tile j: for each of its 16 columns, the pair (v[2p][col], v[2p + 1][col]).
  const int64_t tiles = dv / 16;
  for (int64_t p = 0; p < 16; ++p) {
    const float* r0 = 2 * p < n ? v[2 * p] : nullptr;
    const float* r1 = 2 * p + 1 < n ? v[2 * p + 1] : nullptr;
    for (int64_t j = 0; j < tiles; ++j) {
      const __m512 x0 = r0 ? _mm512_loadu_ps(r0 + j * 16) : _mm512_setzero_ps();
      const __m512 x1 = r1 ? _mm512_loadu_ps(r1 + j * 16) : _mm512_setzero_ps();
      const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x0));
      const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x1));
      _mm512_storeu_si512(out + j * kTile + p * 32, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

void product(const uint16_t* a, int64_t lda, int64_t rows, int64_t chunks, const uint16_t* b, int64_t b_col, int64_t b_step, int64_t cols,
             float* c, int64_t ldc, bool accumulate) {
  for (int64_t r = 0; r < rows; r += 32) {
    if (rows - r >= 32) {
      row_tiles<2>(a + r * lda, lda, chunks, b, b_col, b_step, cols, c + r * ldc, ldc, accumulate);
    } else {
      row_tiles<1>(a + r * lda, lda, chunks, b, b_col, b_step, cols, c + r * ldc, ldc, accumulate);
    }
  }
}

}  // namespace kiln::cpu::amx
