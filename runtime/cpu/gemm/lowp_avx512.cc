// The lower-precision micro-kernels and their loops (lowp.h), built with AVX-512 VNNI and BF16
// (CMake sets the flags for this file); lowp.cc calls them only on CPUs that have those.
//
// Each kernel keeps an MRT×48 tile of 32-bit accumulators in 24 vector registers. Per group of
// K (4 bytes for u8s8, 2 bf16 for bf16) it loads three vectors of B's packed panel (a group for
// each of 16 columns per vector) and broadcasts each row's group of A as one 32-bit value:
// `vpdpbusd` adds the four u8·s8 products of a lane, `vdpbf16ps` the two bf16 products. A
// u8s8 panel's last columns take only the vectors they need (u8s8_panels).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/cpu/gemm/lowp_residual.h"
#include "runtime/cpu/gemm/prefetch.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::lowp_avx512 {

namespace {

constexpr int MR = kLowpTile.mr, NR = kLowpTile.nr, NV = NR / 16;

// A tile's rows of C (`rows` of `bytes` from `c`, `ld` bytes apart), which it writes when its
// sums are done, fetched into L1 before it starts, as the f32 tiles do. Where C outgrows L2, its
// lines otherwise arrive only as the stores ask for them: u8s8 at one thread on a Zen 5 core,
// 128x3072x768 took 0.955 ms so against 0.735 fetched, 512x768x768 0.99 against 0.74.
void fetch_rows(const void* c, int64_t ld, int rows, int64_t bytes) {
  for (int i = 0; i < rows; ++i)
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(static_cast<const char*>(c) + i * ld + b, _MM_HINT_T0);
}

// Four bytes of A broadcast to every lane (a vector load, not a byte copy, which would let the
// compiler assume it may write the accumulators and keep them in memory).
__m512i broadcast_group(const uint8_t* p) { return _mm512_broadcastd_epi32(_mm_loadu_si32(p)); }

// The sums of a tile's rows (Σ over K's groups of 4 of A's rows (read in place, `lda` apart) ·
// B's panel − comp) · scale + bias, as f32, then finished into C's rows from i0 from the
// registers (U8s8Finish, where the epilogue's activations apply there) or stored to `tile` for
// u8s8_store. The sums stay in registers until they are converted. A last group shorter than 4
// is loaded masked: B's panel is zero past K, so whatever A's padding would hold adds nothing,
// and no byte past A's rows is read.
struct U8s8Columns {
  __m512i comp[NV];  // a_zero · Σb per column
  __m512 scale[NV], bias[NV];
  __mmask16 mk[NV];  // the panel's real columns
  int nv;            // vectors with any
};

// Where a tile's values go: C's rows from i0 (`fin`), or `tile` (MR × NR floats; fin null).
struct TileDest {
  const U8s8Finish* fin;
  void* c;
  int64_t ldc, i0, n0;
  float* tile;
};

// How a tile finishes its rows: `codes` where the epilogue is a clamp of the u8 codes
// (U8s8Finish::codes; a branch less a value than U8s8Finish::row: MobileNetV2's 112x112
// expansion, 12544x96x16, 119 against 157 us; with the columns' scales and biases folded with
// the output's, one FMA a value to its code: 0.87 of that time again, and MobileNetV2 int8's
// other expansions 0.89-0.95), `registers` where its other activations apply on
// the registers (U8s8Finish::row), `block` where the values go to the tile's block for
// u8s8_store.
enum class Finish { codes, registers, block };

// Row i of the tile's sums as f32, (Σ − comp) · scale + bias, finished as `F` says: the first
// NVT of the panel's vectors, those with real columns (U8s8Columns::nv).
template <int NVT, Finish F>
[[gnu::always_inline]] inline void finish_row(const __m512i (&acc)[NVT], int i, const U8s8Columns& cols, const TileDest& to) {
  __m512 y[NV] = {};
#pragma GCC unroll 16
  for (int j = 0; j < NVT; ++j) y[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[j], cols.comp[j])), cols.scale[j], cols.bias[j]);
  if constexpr (F == Finish::codes) {  // scale and bias folded with the output's (u8s8_panels)
#pragma GCC unroll 16
    for (int j = 0; j < NVT; ++j) to.fin->folded_code_row(y[j], to.c, to.ldc, to.i0 + i, to.n0 + j * 16, cols.mk[j]);
  } else if constexpr (F == Finish::registers) {
    to.fin->row(y, NVT, to.c, to.ldc, to.i0 + i, to.n0, cols.mk);
  } else {
#pragma GCC unroll 16
    for (int j = 0; j < NVT; ++j) _mm512_store_ps(to.tile + i * NR + j * 16, y[j]);
  }
}

// Every loop over the tile's rows and vectors is unrolled whole (`GCC unroll`), so that the sums
// are registers from start to end, as in the f32 tiles (gemm.inc's KILN_UNROLL_TILE): with the
// epilogue's loop over the rows left a loop, they had a place on the stack, zeroed there, stored
// after the K loop and read back (48 vector stores and 24 loads a tile).
template <int MRT, int NVT, Finish F>
void tile_u8s8(int64_t k, const uint8_t* a, int64_t lda, const int8_t* b, const U8s8Columns& cols, const TileDest& to, const PanelPrefetch& fetch) {
  PanelPrefetch pf = fetch;
  __m512i acc[MRT][NVT];
#pragma GCC unroll 16
  for (int i = 0; i < MRT; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NVT; ++j) acc[i][j] = _mm512_setzero_si512();
  const int64_t whole = k / 4;
  // The steps in blocks of 64: with the loop nested, GCC keeps the sums in registers (one flat
  // loop gets them copied and spilled around every vpdpbusd). Every kFetchSteps steps the tile
  // fetches its lines of the next panel (`pf`): as a third loop, blocks of kFetchSteps made the
  // 128-row products 5-10 % slower.
  for (int64_t p0 = 0; p0 < whole; p0 += 64) {
    for (int64_t p = p0; p < std::min(whole, p0 + 64); ++p) {
      if (p % kFetchSteps == 0) pf.fetch();
      __m512i bv[NVT];
#pragma GCC unroll 16
      for (int j = 0; j < NVT; ++j) bv[j] = _mm512_loadu_si512(b + p * NR * 4 + j * 64);
#pragma GCC unroll 16
      for (int i = 0; i < MRT; ++i) {
        const __m512i av = broadcast_group(a + i * lda + p * 4);
#pragma GCC unroll 16
        for (int j = 0; j < NVT; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, bv[j]);
      }
    }
  }
  if (k % 4) {
    const __mmask16 part = static_cast<__mmask16>((1u << (k % 4)) - 1);
    __m512i bv[NVT];
#pragma GCC unroll 16
    for (int j = 0; j < NVT; ++j) bv[j] = _mm512_loadu_si512(b + whole * NR * 4 + j * 64);
#pragma GCC unroll 16
    for (int i = 0; i < MRT; ++i) {
      const __m512i av = _mm512_broadcastd_epi32(_mm_maskz_loadu_epi8(part, a + i * lda + whole * 4));
#pragma GCC unroll 16
      for (int j = 0; j < NVT; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, bv[j]);
    }
  }
  // The epilogue's constants from copies of its own: read where the caller keeps them, each was
  // loaded again after every store to C (a byte or vector store may alias anything), and the
  // epilogue took most of a tile's time where K is short. With the copies, one thread on a Zen 5
  // core (gemm_u8s8, u8 out, Clip): MobileNetV2's expansions 12544x96x16 119 us against 216,
  // 3136x144x24 51 against 86, 784x192x32 20 against 32; 196x576x96 29 against 38 (the sums
  // alone, the epilogue dropped: 46, 23, 10 and 21 us).
  const U8s8Finish fin = *to.fin;
  const U8s8Columns cc = cols;
  const TileDest dest{&fin, to.c, to.ldc, to.i0, to.n0, to.tile};
#pragma GCC unroll 16
  for (int i = 0; i < MRT; ++i) finish_row<NVT, F>(acc[i], i, cc, dest);
}

// acc[MRT×48] (f32, starting from `init`) += Σ over k2 pairs of A's packed rows · B's panel.
template <int MRT>
void tile_bf16(int64_t k2, const uint16_t* a, const uint16_t* b, const __m512 (&init)[NV], __m512 (&out)[MR][NV], PanelPrefetch pf) {
  __m512 acc[MRT][NV];
  for (int i = 0; i < MRT; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = init[j];
  for (int64_t p0 = 0; p0 < k2; p0 += 64) {  // nested, as in tile_u8s8
    for (int64_t p = p0; p < std::min(k2, p0 + 64); ++p) {
      if (p % kFetchSteps == 0) pf.fetch();
      __m512bh bv[NV];
      for (int j = 0; j < NV; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + p * NR * 2 + j * 32);
      for (int i = 0; i < MRT; ++i) {
        const __m512bh av = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(a + (p * MR + i) * 2));
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
      }
    }
  }
  for (int i = 0; i < MRT; ++i)
    for (int j = 0; j < NV; ++j) out[i][j] = acc[i][j];
}

template <class T, template <int> class F, size_t... R>
constexpr auto table(std::index_sequence<R...>) {
  return std::array<T, sizeof...(R)>{&F<static_cast<int>(R) + 1>::run...};
}

template <int NVT, Finish F>
struct U8s8 {
  template <int MRT>
  struct Rows {
    static void run(int64_t k, const uint8_t* a, int64_t lda, const int8_t* b, const U8s8Columns& cols, const TileDest& to,
                    const PanelPrefetch& pf) {
      tile_u8s8<MRT, NVT, F>(k, a, lda, b, cols, to, pf);
    }
  };
};
template <int MRT>
struct Bf16 {
  static void run(int64_t k2, const uint16_t* a, const uint16_t* b, const __m512 (&init)[NV], __m512 (&acc)[MR][NV], const PanelPrefetch& pf) {
    tile_bf16<MRT>(k2, a, b, init, acc, pf);
  }
};

// The fetches by reference, as gemm.inc's tiles take them (each tile_ works on its own copy).
using U8s8Fn = void (*)(int64_t, const uint8_t*, int64_t, const int8_t*, const U8s8Columns&, const TileDest&, const PanelPrefetch&);
using Bf16Fn = void (*)(int64_t, const uint16_t*, const uint16_t*, const __m512 (&)[NV], __m512 (&)[MR][NV], const PanelPrefetch&);
// A finish's tiles by the vectors they compute (1 to NV), then by rows.
template <Finish F>
constexpr std::array<std::array<U8s8Fn, MR>, NV> kU8s8Widths = {
    table<U8s8Fn, U8s8<1, F>::template Rows>(std::make_index_sequence<MR>()),
    table<U8s8Fn, U8s8<2, F>::template Rows>(std::make_index_sequence<MR>()),
    table<U8s8Fn, U8s8<3, F>::template Rows>(std::make_index_sequence<MR>())};
static_assert(NV == 3, "kU8s8Widths lists a tile for each width");
// By how the tiles finish (Finish's order), then by width and rows.
constexpr std::array<std::array<std::array<U8s8Fn, MR>, NV>, 3> kU8s8 = {
    kU8s8Widths<Finish::codes>, kU8s8Widths<Finish::registers>, kU8s8Widths<Finish::block>};
constexpr auto kBf16 = table<Bf16Fn, Bf16>(std::make_index_sequence<MR>());

}  // namespace

void u8s8_panels(int64_t m, int64_t mc, int64_t p0, int64_t p1, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b,
                 const QuantEpilogue& ep, void* c, int64_t ldc, int64_t n) {
  const int64_t k4 = (k + 3) / 4;
  const __m512i a_zero = _mm512_set1_epi32(ep.a_zero);
  const int64_t panel_bytes = k4 * NR * 4, blocks = (k / 4 + kFetchSteps - 1) / kFetchSteps;
  const U8s8Finish fin(ep);
  const Finish how = !u8s8_on_registers(ep) ? Finish::block : fin.codes() ? Finish::codes : Finish::registers;
  const auto& widths = kU8s8[static_cast<size_t>(how)];
  for (int64_t ib = 0; ib < m; ib += mc)  // a block of A's rows stays in L2 while B's panels pass
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t n0 = panel * NR, tiles = (std::min(m, ib + mc) - ib + MR - 1) / MR;
    const int w = static_cast<int>(std::min<int64_t>(NR, n - n0));
    const int8_t* bp = b + panel * panel_bytes;
    const int8_t* next = panel + 1 < p1 ? bp + panel_bytes : nullptr;  // which the tiles fetch as they go
    const PanelShares fetch(next, panel_bytes, tiles, blocks);
    // Per column: what A's zero point adds to the sum (a_zero · Σb, taken away in integers,
    // exactly, before the scale), the scale and the bias.
    U8s8Columns cols;
    cols.nv = (w + 15) / 16;
    for (int j = 0; j < NV; ++j) {
      const __mmask16 mk = cols.mk[j] = lanes16(w - j * 16);
      cols.scale[j] = _mm512_maskz_loadu_ps(mk, ep.scale + n0 + j * 16);
      cols.comp[j] = _mm512_mullo_epi32(a_zero, _mm512_maskz_loadu_epi32(mk, ep.col_sums + n0 + j * 16));
      cols.bias[j] = ep.bias ? _mm512_maskz_loadu_ps(mk, ep.bias + n0 + j * 16) : _mm512_setzero_ps();
      if (how == Finish::codes) {  // y / out_scale + out_zero in one FMA a value: scale and bias folded
        const __m512 inv = _mm512_set1_ps(1.f / ep.out_scale);
        cols.scale[j] = _mm512_mul_ps(cols.scale[j], inv);
        cols.bias[j] = _mm512_fmadd_ps(cols.bias[j], inv, _mm512_set1_ps(static_cast<float>(ep.out_zero)));
      }
    }
    // The tiles compute only the panel's vectors that hold real columns, as the f32 panels do:
    // the last panel of an N short of a multiple of 48 (int8 ResNet-50's 128 and 256, YOLO's
    // from 16 to 255) computes one or two. One thread on the 2-core Xeon (AVX512-VNNI, no AMX),
    // the GEMM bench's u8s8, 6 alternated runs: 12544x64x148 0.75 → 0.58 ms, 784x128x512 and
    // 196x256x1024 0.92 of their time, 49x512x2048 0.98; int8 ResNet-50's convolutions on this
    // kernel 0.90-0.92 (into 128 and 256 channels) and 0.96-0.99 (512).
    const auto& kernels = widths[static_cast<size_t>(cols.nv - 1)];
    for (int64_t i0 = ib; i0 < std::min(m, ib + mc); i0 += MR) {
      const int rows_here = static_cast<int>(std::min<int64_t>(MR, m - i0));
      alignas(64) float tile[MR][NR];
      const int64_t size = ep.out_u8 ? 1 : 4;
      fetch_rows(static_cast<const std::byte*>(c) + (i0 * ldc + n0) * size, ldc * size, rows_here, w * size);
      kernels[static_cast<size_t>(rows_here - 1)](k, a + i0 * lda, lda, bp, cols, TileDest{&fin, c, ldc, i0, n0, &tile[0][0]},
                                                  fetch((i0 - ib) / MR));
      if (how == Finish::block) u8s8_store(&tile[0][0], NR, rows_here, w, ep, c, ldc, i0, n0);
    }
  }
}

void u8s8_store(float* values, int64_t ld, int rows, int w, const QuantEpilogue& ep, void* c, int64_t ldc, int64_t i0, int64_t n0) {
  const int nv = (w + 15) / 16;
  const RowKernels& rows_k = row_kernels(Isa::avx512);
  const U8s8Residual z(ep);
  const U8s8Out out(ep);
  if (ep.act.kind != Activation::none) rows_k.tile_epilogue(values, ld, nullptr, 0, rows, w, ep.act, ActivationSpec{});
  if (ep.has_z())
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < nv; ++j) {
        float* v = values + i * ld + j * 16;
        _mm512_store_ps(v, _mm512_add_ps(_mm512_load_ps(v), z.at(i0 + i, n0 + j * 16, lanes16(w - j * 16))));
      }
  if (ep.post.kind != Activation::none) rows_k.tile_epilogue(values, ld, nullptr, 0, rows, w, ep.post, ActivationSpec{});
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < nv; ++j) out.store(_mm512_load_ps(values + i * ld + j * 16), c, ldc, i0 + i, n0 + j * 16, lanes16(w - j * 16));
}

void bf16_pack_a(const float* a, int64_t lda, int64_t m0, int64_t rows, int64_t k, uint16_t* out) {
  // Each row converted 32 values at a time (vcvtne2ps2bf16: round to nearest even), then its
  // pairs dealt out to the panel's steps as 32-bit words.
  const int64_t k2 = (k + 1) / 2;
  auto* words = reinterpret_cast<uint32_t*>(out);
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) {
      for (int64_t p = 0; p < k2; ++p) words[p * MR + i] = 0;
      continue;
    }
    const float* row = a + (m0 + i) * lda;
    for (int64_t p0 = 0; p0 < k2; p0 += 16) {
      const int64_t f0 = 2 * p0, left = k - f0;  // floats of the row from f0
      const __m512 lo = _mm512_maskz_loadu_ps(lanes16(static_cast<int>(std::min<int64_t>(left, 16))), row + f0);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes16(static_cast<int>(std::min<int64_t>(left - 16, 16))), row + f0 + 16);
      alignas(64) uint32_t pairs[16];
      _mm512_store_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      for (int64_t q = 0; q < std::min<int64_t>(16, k2 - p0); ++q) words[(p0 + q) * MR + i] = pairs[q];
    }
  }
}

void bf16_panels(int64_t m, int64_t mc, int64_t p0, int64_t p1, int64_t k, const uint16_t* a_packed, const uint16_t* b,
                 const Epilogue& ep, float* c, int64_t ldc, std::span<const ColumnPart> parts, int64_t n) {
  const RowKernels& rows = row_kernels(Isa::avx512);
  const int64_t k2 = (k + 1) / 2, panel_elements = k2 * NR * 2, blocks = (k2 + kFetchSteps - 1) / kFetchSteps;
  for (int64_t ib = 0; ib < m; ib += mc)
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t n0 = panel * NR, tiles = (std::min(m, ib + mc) - ib + MR - 1) / MR;
    const int w = static_cast<int>(std::min<int64_t>(NR, n - n0));
    const uint16_t* bp = b + panel * panel_elements;
    const uint16_t* next = panel + 1 < p1 ? bp + panel_elements : nullptr;  // which the tiles fetch as they go
    const PanelShares fetch(next, panel_elements * 2, tiles, blocks);
    __m512 init[NV];
    for (int j = 0; j < NV; ++j) init[j] = ep.bias ? _mm512_maskz_loadu_ps(lanes16(w - j * 16), ep.bias + n0 + j * 16) : _mm512_setzero_ps();
    for (int64_t i0 = ib; i0 < std::min(m, ib + mc); i0 += MR) {
      const int rows_here = static_cast<int>(std::min<int64_t>(MR, m - i0));
      __m512 acc[MR][NV];
      if (parts.empty()) fetch_rows(c + i0 * ldc + n0, ldc * 4, rows_here, w * 4);
      kBf16[static_cast<size_t>(rows_here - 1)](k2, a_packed + (i0 / MR) * k2 * MR * 2, bp, init, acc, fetch((i0 - ib) / MR));
      if (parts.empty()) {
        for (int i = 0; i < rows_here; ++i)
          for (int j = 0; j < NV; ++j) _mm512_mask_storeu_ps(c + (i0 + i) * ldc + n0 + j * 16, lanes16(w - j * 16), acc[i][j]);
        if (ep.has_tail())
          rows.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, rows_here, w, ep.act,
                             ep.post);
        continue;
      }
      // Split outputs: each vector's 16 columns lie in one part (gemm_bf16's).
      for (int j = 0; j < NV && j * 16 < w; ++j) {
        const int wj = std::min(16, w - j * 16);
        const auto [ct, ldct, plain] = c_at(c, ldc, parts, i0, n0 + j * 16);
        for (int i = 0; i < rows_here; ++i) _mm512_mask_storeu_ps(ct + i * ldct, lanes16(wj), acc[i][j]);
        if (ep.has_tail() && !plain)
          rows.tile_epilogue(ct, ldct, ep.z ? ep.z + i0 * ep.ldz + n0 + j * 16 : nullptr, ep.ldz, rows_here, wj, ep.act, ep.post);
      }
    }
  }
}

void s8_column_sums(const int8_t* packed, int64_t panels, int64_t k4, int64_t n, int32_t* col_sums) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t p = 0; p < panels; ++p) {
    const int8_t* panel = packed + p * k4 * NR * 4;
    __m512i acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = _mm512_setzero_si512();
    for (int64_t g = 0; g < k4; ++g)  // each lane: one column's 4 steps of the group, times 1
      for (int j = 0; j < NV; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], ones, _mm512_loadu_si512(panel + (g * NR + j * 16) * 4));
    for (int j = 0; j < NV; ++j) {
      const int64_t c0 = p * NR + j * 16;
      if (c0 < n) _mm512_mask_storeu_epi32(col_sums + c0, lanes16(n - c0), acc[j]);
    }
  }
}

void pair_f16(const float* panels, int64_t k, int64_t n, uint16_t* out) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  constexpr int64_t kNr = kF16Tile.nr;
  static_assert(kNr % 16 == 0);
  // Lane 2i of a pair's vector: lane i of the first row's 16 values, lane 2i + 1: of the second's.
  alignas(64) static constexpr uint16_t kOrder[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kOrder);
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < (n + kNr - 1) / kNr; ++p)
    for (int64_t q = 0; q < pairs; ++q) {
      const float* first = panels + (p * k + 2 * q) * kNr;
      const bool second = 2 * q + 1 < k;  // zeros past an odd K
      uint16_t* to = out + (p * pairs + q) * 2 * kNr;
      for (int64_t j = 0; j < kNr; j += 16) {
        const __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(first + j), kNearest);
        const __m256i b = second ? _mm512_cvtps_ph(_mm512_loadu_ps(first + kNr + j), kNearest) : _mm256_setzero_si256();
        _mm512_storeu_si512(to + 2 * j, _mm512_permutexvar_epi16(order, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)));
      }
    }
}

}  // namespace kiln::cpu::gemm::lowp_avx512
