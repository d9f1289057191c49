// The direct int8 convolution's row kernel (qconv_direct.h), built with AVX-512 BW and VNNI
// (CMake sets the flags for this file); qconv_direct.cc calls it only on CPUs that have them.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "formats/ops/epilogue.h"
#include "runtime/cpu/qconv_direct.h"
#include "runtime/cpu/vps.h"

namespace kiln::cpu::qcd {

namespace {

// SiLU a vector at a time, as the row kernels compute it.
#include "runtime/cpu/logistic.inc"

inline __m512i broadcast_group(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// P output pixels (pixel q's window row ky at rows[ky] + q·step) into y (P pixels of cout
// bytes): the sums of every row's groups against their weights, then the epilogue (with the
// SiLU where SILU), the requantization and the store of each vector's 16 codes.
template <int V, int P, bool SILU>
void block(const Params& p, const uint8_t* const* rows, int64_t step, uint8_t* y) {
  // The sums start at −zx · Σw: what x's zero point adds is taken off exactly, as an integer.
  __m512i acc[P][V];
  for (int v = 0; v < V; ++v) {
    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(p.zero_sums + v * kLanes));
    for (int q = 0; q < P; ++q) acc[q][v] = start;
  }
  const auto* w = reinterpret_cast<const __m512i*>(p.weights);
  const int64_t kh = p.kh, groups = p.row_groups;
  for (int64_t ky = 0; ky < kh; ++ky) {
    const uint8_t* r = rows[ky];
    for (int64_t g = 0; g < groups; ++g, w += V) {
      __m512i wv[V];
      for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_si512(w + v);
#pragma GCC unroll 12
      for (int q = 0; q < P; ++q) {
        const __m512i b = broadcast_group(r + q * step + g * 4);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[q][v] = _mm512_dpbusd_epi32(acc[q][v], b, wv[v]);
      }
    }
  }
  const __m512 inv = _mm512_set1_ps(p.inv_y_scale), zero = _mm512_set1_ps(p.y_zero);
  const __m512 lo = _mm512_set1_ps(p.lo), hi = _mm512_set1_ps(p.hi);
  const int64_t cout = p.cout, last = cout - (V - 1) * kLanes;  // the last vector's channels
  for (int v = 0; v < V; ++v) {
    const __m512 scale = _mm512_loadu_ps(p.scale + v * kLanes), bias = _mm512_loadu_ps(p.bias + v * kLanes);
    const __mmask16 mask = v + 1 < V || last >= kLanes ? __mmask16(0xffff) : static_cast<__mmask16>((1u << last) - 1);
#pragma GCC unroll 12
    for (int q = 0; q < P; ++q) {
      __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[q][v]), scale, bias);
      if constexpr (SILU) t = _mm512_fmadd_ps(logistic<Activation::silu>(t), inv, zero);
      const __m128i codes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, t))));
      _mm_mask_storeu_epi8(y + q * cout + v * kLanes, mask, codes);
    }
  }
}

// Output row `oy`: the pixels whose windows lie inside the image P at a time, read in place
// (the last block ending where they end, over pixels the one before it computed already, and
// one at a time where a block's last groups would read past the input), the others one at a
// time from their window's rows copied into `scratch`.
template <int V, int P, bool SILU>
void row(const Params& p, const uint8_t* x, const uint8_t* x_end, uint8_t* y, int64_t oy, uint8_t* scratch) {
  const int64_t c = p.c, w = p.w, s = p.s, kw = p.kw, kh = p.kh, ow = p.ow, cout = p.cout, pl = p.pl;
  const int64_t step = s * c, span = p.row_groups * 4;
  y += oy * ow * cout;
  const uint8_t* line[kMaxRows];  // the window's rows in the image (nullptr: above or below it)
  const uint8_t* last_line = nullptr;
  for (int64_t ky = 0; ky < kh; ++ky) {
    const int64_t iy = oy * s - p.pt + ky;
    line[ky] = iy >= 0 && iy < p.h ? x + iy * w * c : nullptr;
    if (line[ky]) last_line = line[ky];
  }
  // Pixels [first, end) have their windows' columns inside the image.
  const int64_t first = std::min(ow, (pl + s - 1) / s);
  const int64_t end = w - kw + pl < 0 ? first : std::max(first, std::min(ow, (w - kw + pl) / s + 1));
  const uint8_t* rows[kMaxRows];
  auto in_place = [&](int64_t ox, int64_t count) {  // pixels ox .. ox + count - 1 read in place?
    if (!last_line) return true;
    return last_line + ((ox + count - 1) * s - pl) * c + span <= x_end;
  };
  auto point = [&](int64_t ox) {
    for (int64_t ky = 0; ky < kh; ++ky) rows[ky] = line[ky] ? line[ky] + (ox * s - pl) * c : p.zero_line;
  };
  auto padded = [&](int64_t ox) {  // one pixel from its window's rows copied
    for (int64_t ky = 0; ky < kh; ++ky) {
      uint8_t* d = scratch + ky * span;
      std::memset(d, p.x_zero, static_cast<size_t>(span));
      if (line[ky])
        for (int64_t kx = 0; kx < kw; ++kx) {
          const int64_t ix = ox * s - pl + kx;
          if (ix >= 0 && ix < w) std::memcpy(d + kx * c, line[ky] + ix * c, static_cast<size_t>(c));
        }
      rows[ky] = d;
    }
    block<V, 1, SILU>(p, rows, 0, y + ox * cout);
  };
  for (int64_t ox = 0; ox < first; ++ox) padded(ox);
  int64_t ox = first;
  for (; ox + P <= end && in_place(ox, P); ox += P) {
    point(ox);
    block<V, P, SILU>(p, rows, step, y + ox * cout);
  }
  if (ox < end && ox > first && end - P >= first && in_place(end - P, P)) {
    point(end - P);
    block<V, P, SILU>(p, rows, step, y + (end - P) * cout);
    ox = end;
  }
  for (; ox < end; ++ox) {
    if (!in_place(ox, 1)) {
      padded(ox);
      continue;
    }
    point(ox);
    block<V, 1, SILU>(p, rows, step, y + ox * cout);
  }
  for (; ox < ow; ++ox) padded(ox);
}

}  // namespace

RowFn row_kernel(const Params& p) {
  // Blocks that keep their sums, a row group's weights and the broadcast group in the 32
  // registers: 12 pixels of one vector, 8 of two, 6 of three or four.
  if (p.silu) switch (p.vectors) {
      case 1: return row<1, 12, true>;
      case 2: return row<2, 8, true>;
      case 3: return row<3, 6, true>;
      default: return row<4, 6, true>;
    }
  switch (p.vectors) {
    case 1: return row<1, 12, false>;
    case 2: return row<2, 8, false>;
    case 3: return row<3, 6, false>;
    default: return row<4, 6, false>;
  }
}

}  // namespace kiln::cpu::qcd
