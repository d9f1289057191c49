// The f16 GEMM's micro-kernel and loops (lowp.h), built with AVX512-FP16 (CMake sets the flags
// for this file); lowp.cc calls them only on CPUs that have it.
//
// A 6×64 tile over pairs of K steps. B's packed panel holds, for each pair of steps, 64 columns
// of two f16 side by side (step 2q in the even lane, 2q + 1 in the odd one: four vectors); A's
// copied rows are f16 too, so one 32-bit word of a row is a pair of steps, and its broadcast (a
// plain `vpbroadcastd` load) puts step 2q's value in every even lane and 2q + 1's in every odd
// one. Each of a row's four `vfmadd231ph` then makes 32 products, 16 columns times two steps,
// and each lane sums every other step. Per pair of steps the tile loads 4 vectors of B and 6
// words of A for 24 FMAs. An 8×64 tile of single steps (each value doubled in its word) loaded
// 10 for 16 and ran at 205-215 GFLOP/s with B in L1 on the 2-core Xeon; this one runs at
// 250-273, of 305-326 that register-only FMAs reach.
// Those sums round to f16 at every step, so each runs for kF16Block products only (a block is
// twice as many steps of K). The sums of kF16Group blocks are added together in f16, one
// add a register a block, each rounding once at the group's size, then widened (`vcvtph2psx`)
// and added into the tile's f32 sums, which keep the two steps apart. Those wait in L1 between
// groups (the f16 sums take 24 registers); after the last block each pair of lanes is added
// and the tile goes to C from the registers. Widening is what a block costs beyond its FMAs
// (on the 2-core Xeon the GEMM bench's f16 rows ran at 83-88 % of peak with blocks as long as a
// chunk, 75-79 % widening every block of 64), so it widens from memory (one FMA-port uop a
// half, against two and a shuffle from a register: 77-82 %) and once a group: four uops a
// register, a quarter as often, for three adds (on the AMX Xeon, the 128x768x768 product's
// tiles alone from 82-84 % of peak to 85-87 %, five alternated runs).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/cpu/gemm/prefetch.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::f16_avx512 {

namespace {

constexpr int MR = kF16Tile.mr, NR = kF16Tile.nr, NV = NR / 16;  // NV vectors of 16 columns × 2 steps
constexpr int64_t kPairs = kF16Block;                             // pairs of steps per block

// The 16 columns of a vector of pairs widened to f32 (`lo`: columns 0-7, each step 2q then
// 2q + 1; `hi`: 8-15), each pair added.
__m512 add_pairs(__m512 lo, __m512 hi) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_add_ps(_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi));
}

// What the tile does to its sums after the last chunk of K, in registers, before they go to C:
// the epilogues made of ReLU and a residual (a ResNet block's), each value
// max(0)?( max(0)?(sum) + z ). Other activations run after it (RowKernels::tile_epilogue).
struct Finish {
  bool on = false;  ///< this is the last chunk of K and the epilogue is one of those
  bool act_relu = false, post_relu = false;
  const float* z = nullptr;  ///< the residual at the tile's first value, or null
  int64_t ldz = 0;
};

// C[MRT×w] (`ldc` apart) = (q0 = 0 ? init : C) + Σ over pairs [q0, q1) of A's copied rows
// (`lda` words apart) · B's panel, then `fin`. The f16 sums (24 registers) join their group's
// in `spill` after each block and are widened and added to the f32 sums after each group's
// last: kept in `sums` (L1) between groups, each pair of lanes added after the last and
// written to C. Every kFetchSteps pairs it fetches its lines of
// the next panel (`pf`).
template <int MRT>
void tile(int64_t q0, int64_t q1, int64_t lda, const uint32_t* a, const uint16_t* b, const __m512 (&init)[NV],
          float (&sums)[MR][2 * NR], float* c, int64_t ldc, int w, PanelPrefetch pf, const Finish& fin) {
  __mmask16 store[NV];
  for (int j = 0; j < NV; ++j) store[j] = lanes16(w - j * 16);
  auto base = [&](int i, int j) { return q0 == 0 ? init[j] : _mm512_maskz_loadu_ps(store[j], c + i * ldc + j * 16); };
  auto put = [&](int i, int j, __m512 v) {
    if (fin.on) {
      const __m512 zero = _mm512_setzero_ps();
      if (fin.act_relu) v = _mm512_max_ps(v, zero);
      if (fin.z) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(store[j], fin.z + i * fin.ldz + j * 16));
      if (fin.post_relu) v = _mm512_max_ps(v, zero);
    }
    _mm512_mask_storeu_ps(c + i * ldc + j * 16, store[j], v);
  };
  if (q1 <= q0) {
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NV; ++j) put(i, j, base(i, j));
    return;
  }
  alignas(64) uint16_t spill[MRT][NV][32];  // the group's f16 sums so far
  for (int64_t r0 = q0; r0 < q1; r0 += kPairs) {
    __m512h h[MRT][NV];
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NV; ++j) h[i][j] = _mm512_setzero_ph();
    const int64_t r1 = std::min(q1, r0 + kPairs);
    auto step = [&](int64_t q) {
      __m512h bv[NV];
      for (int j = 0; j < NV; ++j) bv[j] = _mm512_loadu_ph(b + q * 2 * NR + j * 32);
      for (int i = 0; i < MRT; ++i) {
        const __m512h av = _mm512_castsi512_ph(_mm512_set1_epi32(static_cast<int>(a[i * lda + q])));
        for (int j = 0; j < NV; ++j) h[i][j] = _mm512_fmadd_ph(av, bv[j], h[i][j]);
      }
    };
    // One pair a turn: unrolled by two, GCC 12 hoisted the second pair's loads and spilled
    // accumulators to the stack inside the loop (and a third loop for the fetches made the
    // 128-row products 5-10 % slower).
    for (int64_t q = r0; q < r1; ++q) {
      if ((q - r0) % kFetchSteps == 0) pf.fetch();
      step(q);
    }
    // The block's sums join the group's earlier ones in f16 (one add a register), and the
    // group's widen after its last block. Between blocks and before widening they wait in L1:
    // each half widens from memory (`vcvtph2psx zmm, m256`: one uop on the FMA port, where
    // widening a register takes a shuffle too).
    const int64_t index = (r0 - q0) / kPairs;  // the block's number in this chunk of K
    const bool last = r1 == q1, first = index < kF16Group;
    if (index % kF16Group != 0)
      for (int i = 0; i < MRT; ++i)
        for (int j = 0; j < NV; ++j)
          h[i][j] = _mm512_add_ph(h[i][j], _mm512_castsi512_ph(_mm512_load_si512(spill[i][j])));
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NV; ++j) _mm512_store_si512(spill[i][j], _mm512_castph_si512(h[i][j]));
    if (!last && index % kF16Group != kF16Group - 1) continue;
    auto widen = [&](int i, int j, int half) {
      return _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm256_load_si256(reinterpret_cast<const __m256i*>(&spill[i][j][half * 16]))));
    };
    if (!last) {
      for (int i = 0; i < MRT; ++i)
        for (int j = 0; j < NV; ++j)
          for (int half = 0; half < 2; ++half) {
            float* s = &sums[i][j * 32 + half * 16];
            _mm512_store_ps(s, first ? widen(i, j, half) : _mm512_add_ps(widen(i, j, half), _mm512_load_ps(s)));
          }
      continue;
    }
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < NV; ++j) {
        __m512 wide[2] = {widen(i, j, 0), widen(i, j, 1)};
        if (!first)
          for (int half = 0; half < 2; ++half) wide[half] = _mm512_add_ps(wide[half], _mm512_load_ps(&sums[i][j * 32 + half * 16]));
        put(i, j, _mm512_add_ps(base(i, j), add_pairs(wide[0], wide[1])));
      }
  }
}

template <class T, template <int> class F, size_t... R>
constexpr auto table(std::index_sequence<R...>) {
  return std::array<T, sizeof...(R)>{&F<static_cast<int>(R) + 1>::run...};
}

template <int MRT>
struct Tile {
  static void run(int64_t q0, int64_t q1, int64_t lda, const uint32_t* a, const uint16_t* b, const __m512 (&init)[NV],
                  float (&sums)[MR][2 * NR], float* c, int64_t ldc, int w, const PanelPrefetch& pf, const Finish& fin) {
    tile<MRT>(q0, q1, lda, a, b, init, sums, c, ldc, w, pf, fin);  // a copy: the fetches go on in it
  }
};

using TileFn = void (*)(int64_t, int64_t, int64_t, const uint32_t*, const uint16_t*, const __m512 (&)[NV], float (&)[MR][2 * NR],
                        float*, int64_t, int, const PanelPrefetch&, const Finish&);  // by reference, as gemm.inc's
constexpr auto kTiles = table<TileFn, Tile>(std::make_index_sequence<MR>());

// `count` values from `from` rounded to f16 (vcvtps2phx: to nearest even), 16 at a time.
void narrow_run(const float* from, int64_t count, uint16_t* to) {
  for (int64_t p0 = 0; p0 < count; p0 += 16) {
    const __mmask16 m = lanes16(static_cast<int>(std::min<int64_t>(16, count - p0)));
    const __m256h h = _mm512_cvtxps_ph(_mm512_maskz_loadu_ps(m, from + p0));
    _mm256_mask_storeu_epi16(to + p0, m, _mm256_castph_si256(h));
  }
}

}  // namespace

void pack_a(const float* a, int64_t lda, int64_t m0, int64_t rows, int64_t k, uint32_t* out) {
  const int64_t words = (k + 1) / 2;
  for (int64_t i = 0; i < rows; ++i) {
    auto* to = reinterpret_cast<uint16_t*>(out + i * words);
    narrow_run(a + (m0 + i) * lda, k, to);
    if (k % 2) to[k] = 0;
  }
}

void pack_windows(const ImageWindows& g, const float* x, int64_t m0, int64_t rows, uint32_t* out) {
  const int64_t k = g.k(), words = (k + 1) / 2, pixels = g.oh * g.ow, tap = g.c;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t m = m0 + i, image = m / pixels, y = m % pixels / g.ow, xo = m % pixels % g.ow;
    auto* to = reinterpret_cast<uint16_t*>(out + i * words);
    if (k % 2) to[k] = 0;
    // The taps of a filter row that fall inside the image, [kx0, kx1).
    const int64_t left = xo * g.sw - g.pl;
    int64_t kx0 = 0, kx1 = g.kw;
    while (kx0 < g.kw && left + kx0 * g.dw < 0) ++kx0;
    while (kx1 > kx0 && left + (kx1 - 1) * g.dw >= g.w) --kx1;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      uint16_t* row = to + ky * g.kw * tap;
      const int64_t iy = y * g.sh - g.pt + ky * g.dh;
      if (iy < 0 || iy >= g.h || kx0 == kx1) {
        std::fill(row, row + g.kw * tap, uint16_t{0});
        continue;
      }
      std::fill(row, row + kx0 * tap, uint16_t{0});
      const float* from = x + ((image * g.h + iy) * g.w + left + kx0 * g.dw) * tap;  // tap kx0
      if (g.dw == 1) {  // the taps lie side by side in the image: one run
        narrow_run(from, (kx1 - kx0) * tap, row + kx0 * tap);
      } else {
        for (int64_t kx = kx0; kx < kx1; ++kx) narrow_run(from + (kx - kx0) * g.dw * tap, tap, row + kx * tap);
      }
      std::fill(row + kx1 * tap, row + g.kw * tap, uint16_t{0});
    }
  }
}

void panels(int64_t m, int64_t mc, int64_t kc, int64_t p0, int64_t p1, int64_t k, const uint32_t* a, const uint16_t* b,
            const Epilogue& ep, float* c, int64_t ldc, std::span<const ColumnPart> parts, int64_t row0, int64_t n) {
  const RowKernels& rows = row_kernels(Isa::avx512);
  const int64_t pairs = (k + 1) / 2;  // words per row of A, pairs of rows of B per panel
  auto relu_or_none = [](const ActivationSpec& a) { return a.kind == Activation::none || a.kind == Activation::relu; };
  const bool fused = relu_or_none(ep.act) && relu_or_none(ep.post);  // the tiles finish the epilogue
  // A block of A's rows and a chunk of K: that part of A stays in L2 while B's panels pass.
  for (int64_t ib = 0; ib < m; ib += mc) {
    // The block's rows in tiles of MR, but its last 7 or 8 rows as 4 + 3 or 4 + 4: a tile of one
    // or two rows loads B's four vectors for four or eight products, and waits on L2 (BERT's
    // 128-row products 1-2.6 % faster, a transformer's usual M).
    const int64_t ie = std::min(m, ib + mc), rem = (ie - ib) % MR;
    const int64_t split = ie - ib > MR && (rem == 1 || rem == 2) ? ie - MR - rem : ie;
    const int64_t tiles = (split - ib + MR - 1) / MR + (split < ie ? 2 : 0);
    for (int64_t k0 = 0; k0 == 0 || k0 < k; k0 += kc) {  // once when K = 0: C = the bias
      const int64_t k1 = std::min(k, k0 + kc), q0 = k0 / 2, q1 = (k1 + 1) / 2, blocks = (q1 - q0 + kFetchSteps - 1) / kFetchSteps;
      for (int64_t panel = p0; panel < p1; ++panel) {
        const int64_t n0 = panel * NR;
        const int w = static_cast<int>(std::min<int64_t>(NR, n - n0));
        const uint16_t* bp = b + panel * pairs * 2 * NR;
        // The chunk of B the next panel reads, which the tiles fetch as they go.
        const uint16_t* next = panel + 1 < p1  ? bp + pairs * 2 * NR + q0 * 2 * NR
                               : k1 < k        ? b + p0 * pairs * 2 * NR + q1 * 2 * NR
                                               : nullptr;
        __m512 init[NV];
        for (int j = 0; j < NV; ++j)
          init[j] = ep.bias ? _mm512_maskz_loadu_ps(lanes16(w - j * 16), ep.bias + n0 + j * 16) : _mm512_setzero_ps();
        const PanelShares fetch(next, (q1 - q0) * 2 * NR * 2, tiles, blocks);
        int64_t tile_index = 0;
        for (int64_t i0 = ib, rows_here = 0; i0 < ie; i0 += rows_here, ++tile_index) {
          rows_here = std::min<int64_t>(i0 < split ? MR : 4, ie - i0);
          const float* z = ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr;
          const auto [ct, ldct, plain] = c_at(c, ldc, parts, row0 + i0, n0);
          Finish fin;
          if (k1 == k && fused && !plain) fin = {true, ep.act.kind == Activation::relu, ep.post.kind == Activation::relu, z, ep.ldz};
          alignas(64) float sums[MR][2 * NR];
          kTiles[static_cast<size_t>(rows_here - 1)](q0, q1, pairs, a + i0 * pairs, bp, init, sums, ct, ldct, w,
                                                     fetch(tile_index), fin);
          if (k1 == k && !fused && !plain && ep.has_tail())
            rows.tile_epilogue(ct, ldct, z, ep.ldz, static_cast<int>(rows_here), w, ep.act, ep.post);
        }
      }
    }
  }
}

}  // namespace kiln::cpu::gemm::f16_avx512
