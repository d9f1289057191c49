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
// (`vcvtph2psx`) and added into the tile's f32 sums. Those wait in L1 between blocks (eight rows
// of them would take the 32 registers the f16 sums need; four rows of f16 sums read B from L2
// twice as often, and ran at 51 % of the f16 peak) and go to C from the registers after the last.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/cpu/gemm/prefetch.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::f16_avx512 {

namespace {

constexpr int MR = kF16Tile.mr, NR = kF16Tile.nr, NH = NR / 32, NV = NR / 16;

__mmask16 mask(int n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1); }

// C[MRT×w] (`ldc` apart) = (k0 = 0 ? init : C) + Σ over [k0, k1) of A's copied rows (`lda`
// words apart) · B's panel. The f16 sums (16 registers) are widened and added to the f32 sums
// at the end of each block: kept in `sums` (L1) between blocks, written to C after the last.
// Before each block it fetches its lines of the next panel (`pf`).
template <int MRT>
void tile(int64_t k0, int64_t k1, int64_t lda, const uint32_t* a, const uint16_t* b, const __m512 (&init)[NV], float (&sums)[MR][NR],
          float* c, int64_t ldc, int w, PanelPrefetch pf) {
  __mmask16 store[NV];
  for (int j = 0; j < NV; ++j) store[j] = mask(w - j * 16);
  if (k1 <= k0) {
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NV; ++j) _mm512_mask_storeu_ps(c + i * ldc + j * 16, store[j], init[j]);
    return;
  }
  for (int64_t p0 = k0; p0 < k1; p0 += kF16Block) {
    __m512h h[MRT][NH];
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NH; ++j) h[i][j] = _mm512_setzero_ph();
    const int64_t p1 = std::min(k1, p0 + kF16Block);
    pf.fetch();
    for (int64_t p = p0; p < p1; ++p) {
      __m512h bv[NH];
      for (int j = 0; j < NH; ++j) bv[j] = _mm512_loadu_ph(b + p * NR + j * 32);
      for (int i = 0; i < MRT; ++i) {
        const __m512h av = _mm512_castsi512_ph(_mm512_set1_epi32(static_cast<int>(a[i * lda + p])));
        for (int j = 0; j < NH; ++j) h[i][j] = _mm512_fmadd_ph(av, bv[j], h[i][j]);
      }
    }
    const bool first = p0 == k0, last = p1 == k1;
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NH; ++j) {
        const __m512i bits = _mm512_castph_si512(h[i][j]);
        const __m512 wide[2] = {_mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_castsi512_si256(bits))),
                                _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_extracti64x4_epi64(bits, 1)))};
        for (int half = 0; half < 2; ++half) {
          const int v = j * 2 + half;
          float* s = &sums[i][v * 16];
          float* to = c + i * ldc + v * 16;
          const __m512 base = !first ? _mm512_load_ps(s) : k0 == 0 ? init[v] : _mm512_maskz_loadu_ps(store[v], to);
          const __m512 sum = _mm512_add_ps(base, wide[half]);
          if (last)
            _mm512_mask_storeu_ps(to, store[v], sum);
          else
            _mm512_store_ps(s, sum);
        }
      }
  }
}

template <class T, template <int> class F, size_t... R>
constexpr auto table(std::index_sequence<R...>) {
  return std::array<T, sizeof...(R)>{&F<static_cast<int>(R) + 1>::run...};
}

template <int MRT>
struct Tile {
  static void run(int64_t k0, int64_t k1, int64_t lda, const uint32_t* a, const uint16_t* b, const __m512 (&init)[NV],
                  float (&sums)[MR][NR], float* c, int64_t ldc, int w, PanelPrefetch pf) {
    tile<MRT>(k0, k1, lda, a, b, init, sums, c, ldc, w, pf);
  }
};

using TileFn = void (*)(int64_t, int64_t, int64_t, const uint32_t*, const uint16_t*, const __m512 (&)[NV], float (&)[MR][NR],
                        float*, int64_t, int, PanelPrefetch);
constexpr auto kTiles = table<TileFn, Tile>(std::make_index_sequence<MR>());

// `count` values from `from` rounded to f16 (vcvtps2phx: to nearest even), 16 at a time, each
// doubled into a word of `to`.
void widen_run(const float* from, int64_t count, uint32_t* to) {
  for (int64_t p0 = 0; p0 < count; p0 += 16) {
    const __mmask16 m = mask(static_cast<int>(std::min<int64_t>(16, count - p0)));
    const __m256h h = _mm512_cvtxps_ph(_mm512_maskz_loadu_ps(m, from + p0));
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_castph_si256(h));
    _mm512_mask_storeu_epi32(to + p0, m, _mm512_or_si512(bits, _mm512_slli_epi32(bits, 16)));
  }
}

}  // namespace

void pack_a(const float* a, int64_t lda, int64_t m0, int64_t rows, int64_t k, uint32_t* out) {
  for (int64_t i = 0; i < rows; ++i) widen_run(a + (m0 + i) * lda, k, out + i * k);
}

void pack_windows(const ImageWindows& g, const float* x, int64_t m0, int64_t rows, uint32_t* out) {
  const int64_t k = g.k(), pixels = g.oh * g.ow, tap = g.c;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t m = m0 + i, image = m / pixels, y = m % pixels / g.ow, xo = m % pixels % g.ow;
    uint32_t* to = out + i * k;
    // The taps of a filter row that fall inside the image, [kx0, kx1).
    const int64_t left = xo * g.sw - g.pl;
    int64_t kx0 = 0, kx1 = g.kw;
    while (kx0 < g.kw && left + kx0 * g.dw < 0) ++kx0;
    while (kx1 > kx0 && left + (kx1 - 1) * g.dw >= g.w) --kx1;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      uint32_t* row = to + ky * g.kw * tap;
      const int64_t iy = y * g.sh - g.pt + ky * g.dh;
      if (iy < 0 || iy >= g.h || kx0 == kx1) {
        std::fill(row, row + g.kw * tap, 0u);
        continue;
      }
      std::fill(row, row + kx0 * tap, 0u);
      const float* from = x + ((image * g.h + iy) * g.w + left + kx0 * g.dw) * tap;  // tap kx0
      if (g.dw == 1) {  // the taps lie side by side in the image: one run
        widen_run(from, (kx1 - kx0) * tap, row + kx0 * tap);
      } else {
        for (int64_t kx = kx0; kx < kx1; ++kx) widen_run(from + (kx - kx0) * g.dw * tap, tap, row + kx * tap);
      }
      std::fill(row + kx1 * tap, row + g.kw * tap, 0u);
    }
  }
}

void panels(int64_t m, int64_t mc, int64_t kc, int64_t p0, int64_t p1, int64_t k, const uint32_t* a, const uint16_t* b,
            const Epilogue& ep, float* c, int64_t ldc, int64_t n) {
  const RowKernels& rows = row_kernels(Isa::avx512);
  // A block of A's rows and a chunk of K: that part of A stays in L2 while B's panels pass.
  for (int64_t ib = 0; ib < m; ib += mc) {
    const int64_t ie = std::min(m, ib + mc), tiles = (ie - ib + MR - 1) / MR;
    for (int64_t k0 = 0; k0 == 0 || k0 < k; k0 += kc) {  // once when K = 0: C = the bias
      const int64_t k1 = std::min(k, k0 + kc), blocks = (k1 - k0 + kF16Block - 1) / kF16Block;
      for (int64_t panel = p0; panel < p1; ++panel) {
        const int64_t n0 = panel * NR;
        const int w = static_cast<int>(std::min<int64_t>(NR, n - n0));
        const uint16_t* bp = b + panel * k * NR;
        // The chunk of B the next panel reads, which the tiles fetch as they go.
        const uint16_t* next = panel + 1 < p1 ? bp + k * NR + k0 * NR : k1 < k ? b + p0 * k * NR + k1 * NR : nullptr;
        __m512 init[NV];
        for (int j = 0; j < NV; ++j)
          init[j] = ep.bias ? _mm512_maskz_loadu_ps(mask(w - j * 16), ep.bias + n0 + j * 16) : _mm512_setzero_ps();
        for (int64_t i0 = ib; i0 < ie; i0 += MR) {
          const int rows_here = static_cast<int>(std::min<int64_t>(MR, m - i0));
          alignas(64) float sums[MR][NR];
          kTiles[static_cast<size_t>(rows_here - 1)](k0, k1, k, a + i0 * k, bp, init, sums, c + i0 * ldc + n0, ldc, w,
                                                     PanelPrefetch::share(next, (k1 - k0) * NR * 2, (i0 - ib) / MR, tiles, blocks));
          if (k1 == k && ep.has_tail())
            rows.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, rows_here, w, ep.act,
                               ep.post);
        }
      }
    }
  }
}

}  // namespace kiln::cpu::gemm::f16_avx512
