// The direct int8 convolution on AMX tiles (qconv_direct.h's amx_rows), built with AMX-TILE,
// AMX-INT8, AVX-512 BW and VNNI (CMake sets the flags for this file); qconv_direct.cc calls it
// only on CPUs that have AMX-INT8 and were granted its tile state.
//
// A window row of KW pixels of C channels is KW·C contiguous bytes of the padded image; the
// rows of 16 output pixels side by side lie `s·c` bytes apart, so one `tileloadd` of 16 rows of
// 64 bytes from the first pixel's row reads a chunk of all 16 windows' rows in place (the
// bytes past KW·C, the next pixels', meet zero weights), and `tdpbusd` multiplies it by a tile
// of 16 output channels' weights: a window (KH rows of `chunks` chunks) is KH·chunks products
// per 16 pixels × 16 channels, where `vpdpbusd` takes a 4-byte group of one pixel at a time.
// Blocks of 32 pixels (two tiles of A) by 32 channels (two of B) keep their sums in tiles 0-3,
// A's in 4-5 and B's in 6-7; the sums are stored and finished on the vector units as the VNNI
// kernel's block finishes its registers.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "formats/ops/epilogue.h"
#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/qconv_direct.h"
#include "runtime/cpu/vps.h"

namespace kiln::cpu::qcd {

namespace {

// SiLU a vector at a time, as the row kernels compute it.
#include "runtime/cpu/logistic.inc"

constexpr int64_t kLd = 32;  // columns of a block's stored sums (two tiles)

// Tiles 0-3 = A's R tiles of 16 pixels (from `a`, rows `lda` bytes apart; the second 16
// pixels `second` bytes on) · B's C tiles (`b`, the next vector's 1 KiB on) over the window's
// rows and chunks; then stored to `sums` (R·16 × C·16, kLd apart).
template <int R, int C>
void products(const Params& p, const uint8_t* a, int64_t lda, int64_t row_bytes, int64_t second, const int8_t* b, int32_t* sums) {
  _tile_zero(0);
  if constexpr (C > 1) _tile_zero(1);
  if constexpr (R > 1) _tile_zero(2);
  if constexpr (R > 1 && C > 1) _tile_zero(3);
  const int64_t b_chunk = p.vectors * 1024;
  for (int64_t ky = 0; ky < p.kh; ++ky) {
    const uint8_t* ar = a + ky * row_bytes;
    for (int64_t ch = 0; ch < p.chunks; ++ch, b += b_chunk) {
      _tile_loadd(6, b, 64);
      if constexpr (C > 1) _tile_loadd(7, b + 1024, 64);
      _tile_loadd(4, ar + ch * 64, lda);
      _tile_dpbusd(0, 4, 6);
      if constexpr (C > 1) _tile_dpbusd(1, 4, 7);
      if constexpr (R > 1) {
        _tile_loadd(5, ar + second + ch * 64, lda);
        _tile_dpbusd(2, 5, 6);
        if constexpr (C > 1) _tile_dpbusd(3, 5, 7);
      }
    }
  }
  constexpr int64_t stride = kLd * 4;
  _tile_stored(0, sums, stride);
  if constexpr (C > 1) _tile_stored(1, sums + 16, stride);
  if constexpr (R > 1) _tile_stored(2, sums + 16 * kLd, stride);
  if constexpr (R > 1 && C > 1) _tile_stored(3, sums + 16 * kLd + 16, stride);
}

using ProductsFn = void (*)(const Params&, const uint8_t*, int64_t, int64_t, int64_t, const int8_t*, int32_t*);
constexpr ProductsFn kProducts[2][2] = {{&products<1, 1>, &products<1, 2>}, {&products<2, 1>, &products<2, 2>}};

// `pixels` rows of a block's sums (vectors v0, v0 + 1: `cols` of them) into y's codes: the
// sums less zx · Σw, the scale and bias, the SiLU where SILU, the residual z's codes where Z
// (after the activation's clamp), the requantization and the store.
template <bool SILU, bool Z>
void finish(const Params& p, const int32_t* sums, int pixels, int64_t v0, int cols, uint8_t* y, const uint8_t* z) {
  const __m512 inv = _mm512_set1_ps(p.inv_y_scale), zero = _mm512_set1_ps(p.y_zero);
  const __m512 lo = _mm512_set1_ps(p.lo), hi = _mm512_set1_ps(p.hi);
  const __m512 act_lo = _mm512_set1_ps(p.act_lo), act_hi = _mm512_set1_ps(p.act_hi);
  const __m512 z_factor = _mm512_set1_ps(p.z_factor), z_zero = _mm512_set1_ps(p.z_zero);
  const int64_t cout = p.cout;
  for (int j = 0; j < cols; ++j) {
    const int64_t v = v0 + j;
    const __m512i zs = _mm512_loadu_si512(p.zero_sums + v * kLanes);
    const __m512 scale = _mm512_loadu_ps(p.scale + v * kLanes), bias = _mm512_loadu_ps(p.bias + v * kLanes);
    const __mmask16 mask = lanes16(static_cast<int>(std::min<int64_t>(kLanes, cout - v * kLanes)));
    for (int q = 0; q < pixels; ++q) {
      const __m512i acc = _mm512_sub_epi32(_mm512_load_si512(sums + q * kLd + j * 16), zs);
      __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), scale, bias);
      if constexpr (SILU) t = _mm512_fmadd_ps(logistic<Activation::silu>(t), inv, zero);
      if constexpr (Z) {
        const __m512 zq = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, z + q * cout + v * kLanes)));
        t = _mm512_add_ps(_mm512_min_ps(act_hi, _mm512_max_ps(act_lo, t)), _mm512_mul_ps(_mm512_sub_ps(zq, z_zero), z_factor));
      }
      const __m128i codes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, t))));
      _mm_mask_storeu_epi8(y + q * cout + v * kLanes, mask, codes);
    }
  }
}

}  // namespace

void amx_pad(const Params& p, const uint8_t* x, uint8_t* padded, int64_t py0, int64_t py1) {
  const size_t c = static_cast<size_t>(p.c), row = static_cast<size_t>(p.wp) * c;
  for (int64_t py = py0; py < py1; ++py) {
    uint8_t* to = padded + py * static_cast<int64_t>(row);
    const int64_t iy = py - p.pt;
    if (iy < 0 || iy >= p.h) {
      std::memset(to, p.x_zero, row);
      continue;
    }
    std::memset(to, p.x_zero, static_cast<size_t>(p.pl) * c);
    std::memcpy(to + p.pl * p.c, x + iy * p.w * p.c, static_cast<size_t>(p.w) * c);
    std::memset(to + (p.pl + p.w) * p.c, p.x_zero, row - static_cast<size_t>(p.pl + p.w) * c);
  }
}

void amx_rows(const Params& p, const uint8_t* padded, uint8_t* y, const uint8_t* z, int64_t oy0, int64_t oy1) {
  using FinishFn = void (*)(const Params&, const int32_t*, int, int64_t, int, uint8_t*, const uint8_t*);
  const FinishFn fin = p.silu ? (p.residual ? &finish<true, true> : &finish<true, false>)
                              : (p.residual ? &finish<false, true> : &finish<false, false>);
  alignas(64) int32_t sums[32 * kLd];
  const int64_t lda = p.s * p.c, row_bytes = p.wp * p.c, second = 16 * lda;
  amx::configure();
  for (int64_t oy = oy0; oy < oy1; ++oy) {
    const uint8_t* line = padded + oy * p.s * row_bytes;
    uint8_t* yr = y + oy * p.ow * p.cout;
    const uint8_t* zr = z ? z + oy * p.ow * p.cout : nullptr;
    for (int64_t ox = 0; ox < p.ow; ox += 32) {
      const int pixels = static_cast<int>(std::min<int64_t>(32, p.ow - ox));
      const int r = pixels > 16 ? 2 : 1;
      for (int64_t v = 0; v < p.vectors; v += 2) {
        const int cols = static_cast<int>(std::min<int64_t>(2, p.vectors - v));
        kProducts[r - 1][cols - 1](p, line + ox * lda, lda, row_bytes, second, p.amx_weights + v * 1024, sums);
        fin(p, sums, pixels, v, cols, yr + ox * p.cout, zr ? zr + ox * p.cout : nullptr);
      }
    }
  }
  amx::release();
}

}  // namespace kiln::cpu::qcd
