// The int8 depthwise convolution's row kernel (qdwconv.h), built with AVX-512 BW and VNNI
// (CMake sets the flags for this file); qdwconv.cc calls it only on CPUs that have them.
#include <immintrin.h>

#include <algorithm>

#include "formats/ops/epilogue.h"
#include "runtime/cpu/qdwconv.h"
#include "runtime/cpu/vps.h"

namespace kiln::cpu::qdw {

namespace {

// SiLU a vector at a time, as the row kernels compute it.
#include "runtime/cpu/logistic.inc"

__mmask64 byte_mask(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

// One block's quads of group g for the input columns [0, cols) of the window (column q is the
// image's column q − pl): rows r0 + 4g .. r0 + 4g + 3 of x, a row outside the image (or past
// the filter's height, whose weights are zero) and a column in the padding read as x's zero
// point. `mk`: the block's channels.
void build_quads(const Params& p, const uint8_t* x, int64_t r0, int64_t g, int64_t c0, __mmask64 mk, int64_t cols, __m512i* out) {
  const __m512i pad = _mm512_set1_epi8(static_cast<char>(p.x_zero));
  const uint8_t* rows[kGroupRows];
  for (int64_t k = 0; k < kGroupRows; ++k) {
    const int64_t r = r0 + g * kGroupRows + k;
    rows[k] = r >= 0 && r < p.h && g * kGroupRows + k < p.kh ? x + (r * p.w) * p.c + c0 : nullptr;
  }
  for (int64_t q = 0; q < cols; ++q) {
    const int64_t col = q - p.pl;
    __m512i t[kGroupRows];
    for (int64_t k = 0; k < kGroupRows; ++k)
      t[k] = rows[k] && col >= 0 && col < p.w ? _mm512_mask_loadu_epi8(pad, mk, rows[k] + col * p.c) : pad;
    const __m512i lo01 = _mm512_unpacklo_epi8(t[0], t[1]), hi01 = _mm512_unpackhi_epi8(t[0], t[1]);
    const __m512i lo23 = _mm512_unpacklo_epi8(t[2], t[3]), hi23 = _mm512_unpackhi_epi8(t[2], t[3]);
    __m512i* o = out + q * 4;
    _mm512_store_si512(o + 0, _mm512_unpacklo_epi16(lo01, lo23));
    _mm512_store_si512(o + 1, _mm512_unpackhi_epi16(lo01, lo23));
    _mm512_store_si512(o + 2, _mm512_unpacklo_epi16(hi01, hi23));
    _mm512_store_si512(o + 3, _mm512_unpackhi_epi16(hi01, hi23));
  }
}

// Block b's sums' start and epilogue: its constants in registers (or the stack: stores through
// bytes may alias anything, so read from memory each would be loaded again after every store),
// and its four vectors of sums into 64 codes in channel order (the packs undo the lanes'
// interleave).
struct Epilogue {
  Epilogue(const Params& p, int64_t b)
      : inv(_mm512_set1_ps(p.inv_y_scale)), zero(_mm512_set1_ps(p.y_zero)), lo(_mm512_set1_ps(p.lo)), hi(_mm512_set1_ps(p.hi)),
        silu(p.silu) {
    for (int v = 0; v < 4; ++v) {
      start[v] = _mm512_loadu_si512(p.start + (b * 4 + v) * 16);
      scale[v] = _mm512_loadu_ps(p.scale + (b * 4 + v) * 16);
      bias[v] = _mm512_loadu_ps(p.bias + (b * 4 + v) * 16);
    }
  }
  __m512i codes(const __m512i* acc) const {
    __m512i code[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[v]), scale[v], bias[v]);
      if (silu) t = _mm512_fmadd_ps(logistic<Activation::silu>(t), inv, zero);
      code[v] = _mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, t)));  // a NaN: lo
    }
    return _mm512_packus_epi16(_mm512_packs_epi32(code[0], code[1]), _mm512_packs_epi32(code[2], code[3]));
  }
  __m512i start[4];  // where the sums start
  __m512 scale[4], bias[4];
  __m512 inv, zero, lo, hi;
  bool silu;
};

// The block's output columns: the sums of every group's quads against its weights, then the
// epilogue and the packs back into channel order. KW, S and G (groups) known (0: p's).
template <int KW, int S, int G>
void columns(const Params& p, const __m512i* quads, int64_t quad_stride, const int8_t* weights, int64_t b, __mmask64 mk, uint8_t* y) {
  const int64_t kw = KW ? KW : p.kw, s = S ? S : p.s, groups = G ? G : p.groups;
  const Epilogue e(p, b);
  constexpr int kMaxW = G && KW ? G * KW * 4 : 1;
  __m512i wv[kMaxW];  // the weights in registers too
  if constexpr (G && KW)
    for (int i = 0; i < kMaxW; ++i) wv[i] = _mm512_loadu_si512(weights + i * kBlock);
  const int64_t ow = p.ow, c = p.c;
  for (int64_t j = 0; j < ow; ++j) {
    __m512i acc[4] = {e.start[0], e.start[1], e.start[2], e.start[3]};
#pragma GCC unroll 2
    for (int64_t g = 0; g < groups; ++g) {
      const __m512i* qd = quads + g * quad_stride + j * s * 4;
#pragma GCC unroll 8
      for (int64_t dx = 0; dx < kw; ++dx)
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const int64_t i = (g * kw + dx) * 4 + v;
          const __m512i w = G && KW ? wv[i] : _mm512_loadu_si512(weights + i * kBlock);
          acc[v] = _mm512_dpbusd_epi32(acc[v], _mm512_load_si512(qd + dx * 4 + v), w);
        }
    }
    const __m512i bytes = e.codes(acc);
    if (mk == ~__mmask64{0}) _mm512_storeu_si512(y + j * c, bytes);
    else _mm512_mask_storeu_epi8(y + j * c, mk, bytes);
  }
}

// Pair mode (the last block, of 32 channels or fewer, qdwconv.h): group g's quads of channels
// [c0, c0 + 32) (`mk`: those there are) over the input columns [0, cols) of the window, 32
// bytes each, vector v of column q at slot v · slots + (q mod s) · slots / s + q / s of `out`
// (32-byte units); rows and columns outside the image read as x's zero point.
void build_pair_quads(const Params& p, const uint8_t* x, int64_t r0, int64_t g, int64_t c0, __mmask32 mk, int64_t cols, int64_t slots,
                      uint8_t* out) {
  const __m256i pad = _mm256_set1_epi8(static_cast<char>(p.x_zero));
  const uint8_t* rows[kGroupRows];
  for (int64_t k = 0; k < kGroupRows; ++k) {
    const int64_t r = r0 + g * kGroupRows + k;
    rows[k] = r >= 0 && r < p.h && g * kGroupRows + k < p.kh ? x + (r * p.w) * p.c + c0 : nullptr;
  }
  const int64_t per = slots / p.s;
  if (p.c == 32 && p.s == 1) {
    // Two columns a step where both are inside the image: their 64 bytes of each row in one
    // load, and their vectors (adjacent slots at stride 1) in one store each.
    const __m512i pad2 = _mm512_set1_epi8(static_cast<char>(p.x_zero));
    auto* o = reinterpret_cast<__m256i*>(out);
    int64_t q = 0;
    for (; q < cols; ++q) {
      const int64_t col = q - p.pl;
      if (col >= 0 && col + 1 < p.w && q + 1 < cols) {
        __m512i t[kGroupRows];
        for (int64_t k = 0; k < kGroupRows; ++k) t[k] = rows[k] ? _mm512_loadu_si512(rows[k] + col * 32) : pad2;
        const __m512i lo01 = _mm512_unpacklo_epi8(t[0], t[1]), hi01 = _mm512_unpackhi_epi8(t[0], t[1]);
        const __m512i lo23 = _mm512_unpacklo_epi8(t[2], t[3]), hi23 = _mm512_unpackhi_epi8(t[2], t[3]);
        _mm512_storeu_si512(o + q + 0 * slots, _mm512_unpacklo_epi16(lo01, lo23));
        _mm512_storeu_si512(o + q + 1 * slots, _mm512_unpackhi_epi16(lo01, lo23));
        _mm512_storeu_si512(o + q + 2 * slots, _mm512_unpacklo_epi16(hi01, hi23));
        _mm512_storeu_si512(o + q + 3 * slots, _mm512_unpackhi_epi16(hi01, hi23));
        ++q;
        continue;
      }
      __m256i t[kGroupRows];
      for (int64_t k = 0; k < kGroupRows; ++k)
        t[k] = rows[k] && col >= 0 && col < p.w ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + col * 32)) : pad;
      const __m256i lo01 = _mm256_unpacklo_epi8(t[0], t[1]), hi01 = _mm256_unpackhi_epi8(t[0], t[1]);
      const __m256i lo23 = _mm256_unpacklo_epi8(t[2], t[3]), hi23 = _mm256_unpackhi_epi8(t[2], t[3]);
      _mm256_store_si256(o + q + 0 * slots, _mm256_unpacklo_epi16(lo01, lo23));
      _mm256_store_si256(o + q + 1 * slots, _mm256_unpackhi_epi16(lo01, lo23));
      _mm256_store_si256(o + q + 2 * slots, _mm256_unpacklo_epi16(hi01, hi23));
      _mm256_store_si256(o + q + 3 * slots, _mm256_unpackhi_epi16(hi01, hi23));
    }
    return;
  }
  for (int64_t residue = 0; residue < p.s; ++residue) {
    auto* o = reinterpret_cast<__m256i*>(out) + residue * per;
    for (int64_t q = residue; q < cols; q += p.s, ++o) {
      const int64_t col = q - p.pl;
      __m256i t[kGroupRows];
      for (int64_t k = 0; k < kGroupRows; ++k)
        t[k] = rows[k] && col >= 0 && col < p.w ? _mm256_mask_loadu_epi8(pad, mk, rows[k] + col * p.c) : pad;
      const __m256i lo01 = _mm256_unpacklo_epi8(t[0], t[1]), hi01 = _mm256_unpackhi_epi8(t[0], t[1]);
      const __m256i lo23 = _mm256_unpacklo_epi8(t[2], t[3]), hi23 = _mm256_unpackhi_epi8(t[2], t[3]);
      _mm256_store_si256(o + 0 * slots, _mm256_unpacklo_epi16(lo01, lo23));
      _mm256_store_si256(o + 1 * slots, _mm256_unpackhi_epi16(lo01, lo23));
      _mm256_store_si256(o + 2 * slots, _mm256_unpacklo_epi16(hi01, hi23));
      _mm256_store_si256(o + 3 * slots, _mm256_unpackhi_epi16(hi01, hi23));
    }
  }
}

// Pair mode's output columns, two a step: the vectors of columns j and j + 1 (q = j·s + dx and
// q + s, adjacent slots) in one 64-byte load each, the sums and epilogue as columns' above, and
// the 64 bytes after the packs (column j's channels, then column j + 1's) stored as the two
// columns' `mk` channels at y. KW, S and G known (0: p's).
template <int KW, int S, int G>
void pairs(const Params& p, const uint8_t* quads, int64_t slots, const int8_t* weights, int64_t b, __mmask32 mk, uint8_t* y) {
  const int64_t kw = KW ? KW : p.kw, s = S ? S : p.s, groups = G ? G : p.groups;
  const Epilogue e(p, b);
  constexpr int kMaxW = G && KW ? G * KW * 4 : 1;
  __m512i wv[kMaxW];
  if constexpr (G && KW)
    for (int i = 0; i < kMaxW; ++i) wv[i] = _mm512_loadu_si512(weights + i * kBlock);
  const int64_t ow = p.ow, c = p.c, per = slots / s;
  for (int64_t j = 0; j < ow; j += 2) {
    __m512i acc[4] = {e.start[0], e.start[1], e.start[2], e.start[3]};
#pragma GCC unroll 2
    for (int64_t g = 0; g < groups; ++g) {
      const __m256i* qd = reinterpret_cast<const __m256i*>(quads) + g * 4 * slots + j;
#pragma GCC unroll 8
      for (int64_t dx = 0; dx < kw; ++dx)
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const int64_t i = (g * kw + dx) * 4 + v;
          const __m512i w = G && KW ? wv[i] : _mm512_loadu_si512(weights + i * kBlock);
          acc[v] = _mm512_dpbusd_epi32(acc[v], _mm512_loadu_si512(qd + v * slots + (dx % s) * per + dx / s), w);
        }
    }
    const __m512i bytes = e.codes(acc);
    if (c == 32 && j + 1 < ow) {
      _mm512_storeu_si512(y + j * c, bytes);
    } else {
      _mm256_mask_storeu_epi8(y + j * c, mk, _mm512_castsi512_si256(bytes));
      if (j + 1 < ow) _mm256_mask_storeu_epi8(y + (j + 1) * c, mk, _mm512_extracti64x4_epi64(bytes, 1));
    }
  }
}

// Output row `oy`: each block's quads, then its columns; the last block in pair mode where
// p.pair says so.
template <int KW, int S, int G>
void row(const Params& p, const uint8_t* x, uint8_t* y, int64_t oy, uint8_t* scratch) {
  const int64_t r0 = oy * p.s - p.pt;
  const int64_t full = p.pair ? p.blocks - 1 : p.blocks;
  uint8_t* out = y + (oy * p.ow) * p.c;
  const int64_t cols = (p.ow - 1) * p.s + p.kw, quad_stride = cols * 4;
  auto* quads = reinterpret_cast<__m512i*>(scratch);
  for (int64_t b = 0; b < full; ++b) {
    const int64_t c0 = b * kBlock;
    const __mmask64 mk = byte_mask(p.c - c0);
    for (int64_t g = 0; g < p.groups; ++g) build_quads(p, x, r0, g, c0, mk, cols, quads + g * quad_stride);
    columns<KW, S, G>(p, quads, quad_stride, p.weights + b * p.groups * p.kw * 4 * kBlock, b, mk, out + c0);
  }
  if (p.pair) {
    const int64_t b = p.blocks - 1, c0 = b * kBlock, slots = pair_slots(p);
    const __mmask32 mk = p.c - c0 >= 32 ? ~__mmask32{0} : (__mmask32{1} << (p.c - c0)) - 1;
    for (int64_t g = 0; g < p.groups; ++g)
      build_pair_quads(p, x, r0, g, c0, mk, pair_columns(p), slots, scratch + g * 4 * slots * 32);
    pairs<KW, S, G>(p, scratch, slots, p.weights + b * p.groups * p.kw * 4 * kBlock, b, mk, out + c0);
  }
}

}  // namespace

RowFn row_kernel(const Params& p) {
  // MobileNetV2's and EfficientNet-B0's filters known at compile time (3x3: one group of four
  // filter rows; 5x5: two), others as given.
  const bool g1 = p.groups == 1, g2 = p.groups == 2;
  return p.kw == 3 && p.s == 1 && g1   ? row<3, 1, 1>
         : p.kw == 3 && p.s == 2 && g1 ? row<3, 2, 1>
         : p.kw == 5 && p.s == 1 && g2 ? row<5, 1, 2>
         : p.kw == 5 && p.s == 2 && g2 ? row<5, 2, 2>
                                       : row<0, 0, 0>;
}

}  // namespace kiln::cpu::qdw
