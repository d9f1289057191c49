// The weight-only-quantized kernels (woq.h), built with AVX-512 (CMake sets the flags for this
// file); woq.cc calls them only on CPUs that have it.
//
// The micro-kernel keeps an MRT×32 tile of f32 sums (up to 12 rows: 24 registers) for half a
// panel; per step along K it dequantizes that half's K row into two vectors, then broadcasts
// each row's value of A into two FMAs. Up to 4 rows, where the vector float operations bound
// it, it sums a·code within each group instead and scales the group's sums at its end. A code becomes a float in three instructions: a widening
// load (vpmovzxbd / vpmovsxbd: 16 bytes to 16 lanes), a conversion, and one FMA with its
// group's scale and offset. Half a K row of nibbles is one 16-byte load that splits into its
// two vectors of columns (the low nibbles with an and, the high ones with a shift); s4 needs no
// sign extension, as the packing stored it shifted by 8 to 0..15 and folded the 8 into the
// offset.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "runtime/cpu/gemm/woq_isa.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::woq_avx512 {

namespace {

constexpr int HV = static_cast<int>(HALF) / 16;

// How a packed code widens: 8-bit signed or unsigned, or a nibble (u4, and s4 shifted to u4).
enum class Width { s8, u8, u4 };

Width width_of(WoqCodes codes) {
  return codes == WoqCodes::s8 ? Width::s8 : codes == WoqCodes::u8 ? Width::u8 : Width::u4;
}

// Half a K row of a panel's codes (HALF columns: 32 bytes, or one 16-byte chunk of nibbles) as
// floats, not yet scaled.
template <Width W>
void load_codes(const uint8_t* row, int half, __m512 (&out)[HV]) {
  if constexpr (W == Width::u4) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + half * 16)));
    out[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    out[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  } else {
    for (int j = 0; j < HV; ++j) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + half * HALF + j * 16));
      out[j] = _mm512_cvtepi32_ps(W == Width::s8 ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
    }
  }
}

// The same, dequantized with its group's scales and offsets (`scale` at the panel's first column).
template <Width W>
void load_half(const uint8_t* row, int half, const float* scale, __m512 (&out)[HV]) {
  load_codes<W>(row, half, out);
  const float* s = scale + half * HALF;
  for (int j = 0; j < HV; ++j) out[j] = _mm512_fmadd_ps(out[j], _mm512_loadu_ps(s + j * 16), _mm512_loadu_ps(s + NR + j * 16));
}

// Σ of n floats.
float sum(const float* x, int64_t n) {
  __m512 v = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) v = _mm512_add_ps(v, _mm512_loadu_ps(x + i));
  if (i < n) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes16(static_cast<int>(n - i)), x + i));
  return _mm512_reduce_add_ps(v);
}

// c[MRT×w] = bias + A's MRT rows (in place, `lda` apart) · one half of the panel, dequantized K
// row by K row as it is loaded. The groups are the outer loop, so a group's scales and offsets
// stay in registers for all its steps; the sums stay in registers throughout. With one or two
// rows, each sum would wait on its own previous FMA: U sets of sums take turns along K, and are
// added at the end. `next` (or null): the next panel's codes, fetched into L2 step by step while
// the second half runs from the lines the first half brought in, so that the first half of the
// next panel does not wait on memory (int8 decode 10-15 % faster).
template <Width W, int MRT>
void tile(int64_t k, int64_t group, const float* a, int64_t lda, const uint8_t* codes, const float* params, int half,
          const uint8_t* next, const float* bias, float* c, int64_t ldc, int w) {
  constexpr int64_t RB = W == Width::u4 ? NR / 2 : NR;
  constexpr int U = MRT <= 2 ? 2 : 1;
  __m512 acc[U][MRT][HV];
  for (int j = 0; j < HV; ++j) {
    const __m512 init = bias ? _mm512_maskz_loadu_ps(lanes16(w - j * 16), bias + j * 16) : _mm512_setzero_ps();
    for (int i = 0; i < MRT; ++i) {
      acc[0][i][j] = init;
      for (int u = 1; u < U; ++u) acc[u][i][j] = _mm512_setzero_ps();
    }
  }
  auto step = [&](int64_t p, const float* scale, __m512 (&sums)[MRT][HV]) {
    __m512 bv[HV];
    load_half<W>(codes + p * RB, half, scale, bv);
    if (next) _mm_prefetch(reinterpret_cast<const char*>(next + p * RB), _MM_HINT_T1);
    for (int i = 0; i < MRT; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + p]);
      for (int j = 0; j < HV; ++j) sums[i][j] = _mm512_fmadd_ps(av, bv[j], sums[i][j]);
    }
  };
  const int64_t length = group > 0 ? group : k;
  for (int64_t k0 = 0; k0 < k; k0 += length) {
    const float* scale = params + (k0 / length) * 2 * NR;
    const int64_t end = std::min(k, k0 + length);
    int64_t p = k0;
    for (; p + U <= end; p += U)
      for (int u = 0; u < U; ++u) step(p + u, scale, acc[u]);
    for (; p < end; ++p) step(p, scale, acc[0]);
  }
  for (int u = 1; u < U; ++u)
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < HV; ++j) acc[0][i][j] = _mm512_add_ps(acc[0][i][j], acc[u][i][j]);
  for (int j = 0; j < HV; ++j)
    for (int i = 0; i < MRT; ++i) _mm512_mask_storeu_ps(c + i * ldc + j * 16, lanes16(w - j * 16), acc[0][i][j]);
}

// The same product for up to kGroupRows rows, which is bound by its vector float operations (a
// decode step: 1 row, 4 or 8 bits a weight): within a group the sums stay in the codes' domain,
// Σ a·code, and the group's end scales them, scale·Σ a·code + offset·Σ a (= Σ a·(code·scale +
// offset)), so a code costs its conversion and one FMA per row instead of a dequantizing FMA
// more. Σ a over the group is summed once per row.
template <Width W, int MRT>
void tile_grouped(int64_t k, int64_t group, const float* a, int64_t lda, const uint8_t* codes, const float* params, int half,
                  const uint8_t* next, const float* bias, float* c, int64_t ldc, int w) {
  constexpr int64_t RB = W == Width::u4 ? NR / 2 : NR;
  constexpr int U = MRT <= 2 ? 2 : 1;
  __m512 acc[MRT][HV];
  for (int j = 0; j < HV; ++j) {
    const __m512 init = bias ? _mm512_maskz_loadu_ps(lanes16(w - j * 16), bias + j * 16) : _mm512_setzero_ps();
    for (int i = 0; i < MRT; ++i) acc[i][j] = init;
  }
  const int64_t length = group > 0 ? group : k;
  for (int64_t k0 = 0; k0 < k; k0 += length) {
    const int64_t end = std::min(k, k0 + length);
    __m512 sums[U][MRT][HV];
    for (int u = 0; u < U; ++u)
      for (int i = 0; i < MRT; ++i)
        for (int j = 0; j < HV; ++j) sums[u][i][j] = _mm512_setzero_ps();
    auto step = [&](int64_t p, __m512 (&s)[MRT][HV]) {
      __m512 bv[HV];
      load_codes<W>(codes + p * RB, half, bv);
      if (next) _mm_prefetch(reinterpret_cast<const char*>(next + p * RB), _MM_HINT_T1);
      for (int i = 0; i < MRT; ++i) {
        const __m512 av = _mm512_set1_ps(a[i * lda + p]);
        for (int j = 0; j < HV; ++j) s[i][j] = _mm512_fmadd_ps(av, bv[j], s[i][j]);
      }
    };
    int64_t p = k0;
    for (; p + U <= end; p += U)
      for (int u = 0; u < U; ++u) step(p + u, sums[u]);
    for (; p < end; ++p) step(p, sums[0]);
    const float* scale = params + (k0 / length) * 2 * NR + half * HALF;
    for (int i = 0; i < MRT; ++i) {
      const __m512 a_sum = _mm512_set1_ps(sum(a + i * lda + k0, end - k0));
      for (int j = 0; j < HV; ++j) {
        __m512 s = sums[0][i][j];
        for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, sums[u][i][j]);
        acc[i][j] = _mm512_fmadd_ps(s, _mm512_loadu_ps(scale + j * 16), acc[i][j]);
        acc[i][j] = _mm512_fmadd_ps(a_sum, _mm512_loadu_ps(scale + NR + j * 16), acc[i][j]);
      }
    }
  }
  for (int j = 0; j < HV; ++j)
    for (int i = 0; i < MRT; ++i) _mm512_mask_storeu_ps(c + i * ldc + j * 16, lanes16(w - j * 16), acc[i][j]);
}

template <Width W>
void dequantize_rows(const uint8_t* codes, const float* params, int64_t group, int64_t k0, int64_t kc, float* out) {
  constexpr int64_t RB = W == Width::u4 ? NR / 2 : NR;
  for (int64_t p = k0; p < k0 + kc;) {
    const int64_t g = group > 0 ? p / group : 0;
    const int64_t end = group > 0 ? std::min(k0 + kc, (g + 1) * group) : k0 + kc;
    const float* scale = params + g * 2 * NR;
    for (; p < end; ++p)
      for (int half = 0; half < 2; ++half) {
        __m512 bv[HV];
        load_half<W>(codes + p * RB, half, scale, bv);
        for (int j = 0; j < HV; ++j) _mm512_storeu_ps(out + (p - k0) * NR + half * HALF + j * 16, bv[j]);
      }
  }
}

using TileFn = void (*)(int64_t, int64_t, const float*, int64_t, const uint8_t*, const float*, int, const uint8_t*,
                        const float*, float*, int64_t, int);

// Each width's kernels, indexed by rows - 1: the grouped sums up to kGroupRows rows (where the
// extra accumulators still fit the registers), the dequantizing loads above.
constexpr int kGroupRows = 4;
template <Width W, int MRT>
constexpr TileFn tile_fn() {
  if constexpr (MRT <= kGroupRows) return &tile_grouped<W, MRT>;
  else return &tile<W, MRT>;
}
template <Width W, size_t... R>
constexpr std::array<TileFn, MR> tile_table(std::index_sequence<R...>) {
  return {tile_fn<W, static_cast<int>(R) + 1>()...};
}
constexpr std::array<std::array<TileFn, MR>, 3> kTiles = {tile_table<Width::s8>(std::make_index_sequence<MR>()),
                                                          tile_table<Width::u8>(std::make_index_sequence<MR>()),
                                                          tile_table<Width::u4>(std::make_index_sequence<MR>())};

}  // namespace

void dequantizing_panels(int64_t m, int64_t p0, int64_t p1, int64_t n, int64_t k, int64_t group, const float* a,
                         int64_t lda, const std::byte* b, WoqCodes codes, const Epilogue& ep, float* c, int64_t ldc) {
  const RowKernels& rows = row_kernels(Isa::avx512);
  const std::array<TileFn, MR>& fns = kTiles[static_cast<size_t>(width_of(codes))];
  const int64_t stride = panel_bytes(k, group, codes), params_at = codes_bytes(k, codes);
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t n0 = panel * NR;
    const int w = static_cast<int>(std::min(NR, n - n0));
    const auto* bp = reinterpret_cast<const uint8_t*>(b + panel * stride);
    const auto* params = reinterpret_cast<const float*>(b + panel * stride + params_at);
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
      const int rows_here = static_cast<int>(std::min(MR, m - i0));
      for (int half = 0; half * HALF < w; ++half) {
        const int64_t j0 = n0 + half * HALF;
        const uint8_t* next = half == 1 && panel + 1 < p1 ? bp + stride : nullptr;
        const int cols = static_cast<int>(std::min<int64_t>(HALF, w - half * HALF));
        fns[static_cast<size_t>(rows_here - 1)](k, group, a + i0 * lda, lda, bp, params, half, next,
                                                ep.bias ? ep.bias + j0 : nullptr, c + i0 * ldc + j0, ldc, cols);
      }
      if (ep.has_tail())
        rows.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, rows_here, w, ep.act,
                           ep.post);
    }
  }
}

void dequantize(const std::byte* panel, WoqCodes codes, int64_t k, int64_t group, int64_t k0, int64_t kc, float* out) {
  const auto* bp = reinterpret_cast<const uint8_t*>(panel);
  const auto* params = reinterpret_cast<const float*>(panel + codes_bytes(k, codes));
  switch (width_of(codes)) {
    case Width::s8: return dequantize_rows<Width::s8>(bp, params, group, k0, kc, out);
    case Width::u8: return dequantize_rows<Width::u8>(bp, params, group, k0, kc, out);
    case Width::u4: return dequantize_rows<Width::u4>(bp, params, group, k0, kc, out);
  }
}

}  // namespace kiln::cpu::gemm::woq_avx512
