// The f16 GEMM's micro-kernel and loops (lowp.h), built with AVX512-FP16 (CMake sets the flags
// for this file); lowp.cc calls them only on CPUs that have it.
//
// An 8×64 tile: per step of K, two vectors of B's packed panel (32 f16 columns each) and each
// row's value of A broadcast feed two `vfmadd231ph` (32 f16 products and sums per lane set).
// A is copied as f16 with each value twice in a 32-bit word, so that its broadcast is a plain
// `vpbroadcastd` load (a 16-bit broadcast costs a shuffle on a port the FMAs need); its rows
// stay rows (K words each), which the kernel reads side by side, so the copy is a conversion
// 16 values at a time (an interleaved panel took one store per value: as long as the products
// on ResNet-50's pointwise layers).
// Those sums round to f16 at every step, so they run for kF16Block steps only, then are widened
// (`vcvtph2psx`) and added into the tile's f32 sums, kept in L1 (eight rows of them would take
// the 32 registers the f16 sums need; four rows of f16 sums read B from L2 twice as often, and
// ran at 51 % of the f16 peak).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::f16_avx512 {

namespace {

constexpr int MR = kF16Tile.mr, NR = kF16Tile.nr, NH = NR / 32, NV = NR / 16;

__mmask16 mask(int n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1); }

// sums[MRT×64] (f32, starting from `init`) += Σ over K of A's copied rows (K words apart) · B's
// panel. The f16 sums (16 registers) are added into `sums` (in L1) at the end of each block.
template <int MRT>
void tile(int64_t k, const uint32_t* a, const uint16_t* b, const __m512 (&init)[NV], float (&sums)[MR][NR]) {
  for (int i = 0; i < MRT; ++i)
    for (int j = 0; j < NV; ++j) _mm512_store_ps(&sums[i][j * 16], init[j]);
  for (int64_t p0 = 0; p0 < k; p0 += kF16Block) {
    __m512h h[MRT][NH];
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NH; ++j) h[i][j] = _mm512_setzero_ph();
    for (int64_t p = p0; p < std::min(k, p0 + kF16Block); ++p) {
      __m512h bv[NH];
      for (int j = 0; j < NH; ++j) bv[j] = _mm512_loadu_ph(b + p * NR + j * 32);
      for (int i = 0; i < MRT; ++i) {
        const __m512h av = _mm512_castsi512_ph(_mm512_set1_epi32(static_cast<int>(a[i * k + p])));
        for (int j = 0; j < NH; ++j) h[i][j] = _mm512_fmadd_ph(av, bv[j], h[i][j]);
      }
    }
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NH; ++j) {
        const __m512i bits = _mm512_castph_si512(h[i][j]);
        const __m512 lo = _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_castsi512_si256(bits)));
        const __m512 hi = _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_extracti64x4_epi64(bits, 1)));
        float* s = &sums[i][j * 32];
        _mm512_store_ps(s, _mm512_add_ps(_mm512_load_ps(s), lo));
        _mm512_store_ps(s + 16, _mm512_add_ps(_mm512_load_ps(s + 16), hi));
      }
  }
}

template <class T, template <int> class F, size_t... R>
constexpr auto table(std::index_sequence<R...>) {
  return std::array<T, sizeof...(R)>{&F<static_cast<int>(R) + 1>::run...};
}

template <int MRT>
struct Tile {
  static void run(int64_t k, const uint32_t* a, const uint16_t* b, const __m512 (&init)[NV], float (&sums)[MR][NR]) {
    tile<MRT>(k, a, b, init, sums);
  }
};

using TileFn = void (*)(int64_t, const uint32_t*, const uint16_t*, const __m512 (&)[NV], float (&)[MR][NR]);
constexpr auto kTiles = table<TileFn, Tile>(std::make_index_sequence<MR>());

}  // namespace

void pack_a(const float* a, int64_t lda, int64_t m0, int64_t rows, int64_t k, uint32_t* out) {
  // Rounded to f16 16 values at a time (vcvtps2phx: to nearest even), each doubled into a word.
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = a + (m0 + i) * lda;
    uint32_t* to = out + i * k;
    for (int64_t p0 = 0; p0 < k; p0 += 16) {
      const __mmask16 m = mask(static_cast<int>(std::min<int64_t>(16, k - p0)));
      const __m256h h = _mm512_cvtxps_ph(_mm512_maskz_loadu_ps(m, row + p0));
      const __m512i bits = _mm512_cvtepu16_epi32(_mm256_castph_si256(h));
      _mm512_mask_storeu_epi32(to + p0, m, _mm512_or_si512(bits, _mm512_slli_epi32(bits, 16)));
    }
  }
}

void panels(int64_t m0, int64_t m, int64_t mc, int64_t p0, int64_t p1, int64_t k, const uint32_t* a, const uint16_t* b,
            const Epilogue& ep, float* c, int64_t ldc, int64_t n) {
  const RowKernels& rows = row_kernels(Isa::avx512);
  for (int64_t ib = m0; ib < m; ib += mc)  // a block of A's rows stays in L2 while B's panels pass
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t n0 = panel * NR;
    const int w = static_cast<int>(std::min<int64_t>(NR, n - n0));
    const uint16_t* bp = b + panel * k * NR;
    __m512 init[NV];
    for (int j = 0; j < NV; ++j)
      init[j] = ep.bias ? _mm512_maskz_loadu_ps(mask(w - j * 16), ep.bias + n0 + j * 16) : _mm512_setzero_ps();
    for (int64_t i0 = ib; i0 < std::min(m, ib + mc); i0 += MR) {
      const int rows_here = static_cast<int>(std::min<int64_t>(MR, m - i0));
      alignas(64) float sums[MR][NR];
      kTiles[static_cast<size_t>(rows_here - 1)](k, a + i0 * k, bp, init, sums);
      for (int i = 0; i < rows_here; ++i)
        for (int j = 0; j < NV; ++j)
          _mm512_mask_storeu_ps(c + (i0 + i) * ldc + n0 + j * 16, mask(w - j * 16), _mm512_load_ps(&sums[i][j * 16]));
      if (ep.has_tail())
        rows.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, rows_here, w, ep.act,
                           ep.post);
    }
  }
}

}  // namespace kiln::cpu::gemm::f16_avx512
