// The weight-only GEMM's 16-bit decode path (woq.h), built with AVX512-VNNI (CMake sets the
// flags for this file); woq.cc calls it only on CPUs that have it, for up to kWoqSplitRows
// rows.
//
// A's rows are first split (split_rows): per block of K, a scale s (the block's largest |a| /
// 32767), and each value as s · (q + rest · 2^-15) with q and rest 16-bit integers, and the
// block's f32 sum. The product then runs on integers: `vpdpwssd` adds two 16-bit products a
// lane, a pair of K values of q (or of rest) against the pair of codes of each column, 32
// multiply-adds an instruction where the f32 path converts the codes and does 16 an FMA; the
// codes are widened once per pair of K rows for both parts and both of a tile's rows. At a
// block's end the integer sums become f32 with the block's scale and the group's:
// scale · s · (Σ q·code + 2^-15 · Σ rest·code) + offset · Σ a.
//
// The codes stay in pack_b_woq's layout: a K row of a panel is 64 bytes of 8-bit codes, or 32
// of nibbles, byte i of each 16 holding column i (low nibble) and column i + 16 (high nibble).
// Rows p and p + 1 interleave byte by byte (`vpunpcklbw` / `vpunpckhbw`, within 128-bit
// lanes) and widen to 16 bits (nibbles then split by an and and a shift) into four vectors of
// (p, p + 1) code pairs, each of columns in two runs of 8 (load_pairs: the "pair order"); the
// group's scales and offsets are shuffled into that order once per block, the sums back into
// column order once per tile.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/cpu/gemm/woq_isa.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::woq_vnni {

namespace {

using woq_avx512::NR;

// How a panel's codes widen: 4-bit (u4, and s4 stored shifted to u4), or 8-bit signed or
// unsigned.
enum class Width { u4, s8, u8 };

// The code pairs of K rows p and p + 1 (both of a panel's 64 columns) as four vectors of 16-bit
// (p, p + 1) pairs, in the width's pair order. 4-bit: rows of 32 bytes, interleaved byte by byte
// and widened, split by an and and a shift: columns {0-7, 32-39}, {8-15, 40-47}, {16-23, 48-55},
// {24-31, 56-63}. 8-bit: rows of 64 bytes, interleaved byte by byte within each 16 and each
// 256-bit half widened: {0-7, 16-23}, {8-15, 24-31}, {32-39, 48-55}, {40-47, 56-63}.
template <Width W>
[[gnu::always_inline]] inline void load_pairs(const uint8_t* codes, int64_t p, __m512i (&v)[4]) {
  if constexpr (W == Width::u4) {
    const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + p * 32));
    const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (p + 1) * 32));
    const __m512i lo = _mm512_cvtepu8_epi16(_mm256_unpacklo_epi8(r0, r1)), hi = _mm512_cvtepu8_epi16(_mm256_unpackhi_epi8(r0, r1));
    const __m512i low = _mm512_set1_epi16(15);
    v[0] = _mm512_and_si512(lo, low), v[1] = _mm512_and_si512(hi, low), v[2] = _mm512_srli_epi16(lo, 4), v[3] = _mm512_srli_epi16(hi, 4);
  } else {
    const __m512i r0 = _mm512_loadu_si512(codes + p * 64), r1 = _mm512_loadu_si512(codes + (p + 1) * 64);
    const __m512i lo = _mm512_unpacklo_epi8(r0, r1), hi = _mm512_unpackhi_epi8(r0, r1);
    auto widen = [](__m256i x) { return W == Width::s8 ? _mm512_cvtepi8_epi16(x) : _mm512_cvtepu8_epi16(x); };
    v[0] = widen(_mm512_castsi512_si256(lo)), v[1] = widen(_mm512_castsi512_si256(hi));
    v[2] = widen(_mm512_extracti64x4_epi64(lo, 1)), v[3] = widen(_mm512_extracti64x4_epi64(hi, 1));
  }
}

// Columns 0-15, 16-31, 32-47, 48-63 into the width's pair order, and back (8-bit's swap of
// 256-bit halves is its own inverse).
template <Width W>
void to_pairs(__m512 (&v)[4]) {
  const int a = W == Width::u4 ? 2 : 1, b = W == Width::u4 ? 1 : 2;
  const __m512 p0 = _mm512_shuffle_f32x4(v[0], v[a], 0x44), p1 = _mm512_shuffle_f32x4(v[0], v[a], 0xEE);
  const __m512 p2 = _mm512_shuffle_f32x4(v[b], v[3], 0x44), p3 = _mm512_shuffle_f32x4(v[b], v[3], 0xEE);
  v[0] = p0, v[1] = p1, v[2] = p2, v[3] = p3;
}
template <Width W>
void to_columns(__m512 (&v)[4]) {
  const __m512 n0 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), n2 = _mm512_shuffle_f32x4(v[0], v[1], 0xEE);
  const __m512 n1 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), n3 = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
  if constexpr (W == Width::u4)
    v[0] = n0, v[1] = n1, v[2] = n2, v[3] = n3;
  else
    v[0] = n0, v[1] = n2, v[2] = n1, v[3] = n3;
}

// c[MRT×w] = bias + split A's MRT rows · one panel of codes. `next` (or null): the next
// panel's codes, fetched into L2 a line per 64 bytes of this one's (woq_avx512's tile does the
// same).
template <Width W, int MRT>
void tile(const SplitA& r, const std::byte* split, const uint8_t* codes, const float* params, const uint8_t* next,
          const float* bias, float* c, int64_t ldc, int w) {
  constexpr int64_t RB = W == Width::u4 ? NR / 2 : NR;
  __m512 acc[MRT][4];
  const int16_t *q[MRT], *rest[MRT];
  const float *scale[MRT], *sum[MRT];
  for (int i = 0; i < MRT; ++i) {
    for (auto& v : acc[i]) v = _mm512_setzero_ps();
    q[i] = r.codes(split, i), rest[i] = r.rests(split, i), scale[i] = r.scales(split, i), sum[i] = r.sums(split, i);
  }
  r.for_blocks([&](int64_t k0, int64_t end, int64_t g, int64_t b) {
    __m512i s[MRT][4], t[MRT][4];  // Σ q · code and Σ rest · code
    for (int i = 0; i < MRT; ++i)
      for (int j = 0; j < 4; ++j) s[i][j] = t[i][j] = _mm512_setzero_si512();
    for (int64_t p = k0; p < end; p += 2) {
      __m512i v[4];
      load_pairs<W>(codes, p, v);
      if (next)
        for (int64_t line = 0; line < 2 * RB; line += 64) _mm_prefetch(reinterpret_cast<const char*>(next + p * RB + line), _MM_HINT_T1);
      for (int i = 0; i < MRT; ++i) {
        int32_t pair, rest_pair;
        std::memcpy(&pair, q[i] + p, sizeof pair);
        std::memcpy(&rest_pair, rest[i] + p, sizeof rest_pair);
        const __m512i av = _mm512_set1_epi32(pair), rv = _mm512_set1_epi32(rest_pair);
        for (int j = 0; j < 4; ++j) {
          s[i][j] = _mm512_dpwssd_epi32(s[i][j], v[j], av);
          t[i][j] = _mm512_dpwssd_epi32(t[i][j], v[j], rv);
          // Each sum stays in its register: without this GCC copied every sum to another
          // register around its vpdpwssd and stored some to the stack, every step.
          asm("" : "+v"(s[i][j]), "+v"(t[i][j]));
        }
      }
    }
    __m512 gs[4], go[4];
    for (int j = 0; j < 4; ++j) {
      gs[j] = _mm512_loadu_ps(params + g * 2 * NR + j * 16);
      go[j] = _mm512_loadu_ps(params + g * 2 * NR + NR + j * 16);
    }
    to_pairs<W>(gs);
    to_pairs<W>(go);
    for (int i = 0; i < MRT; ++i) {
      const __m512 sa = _mm512_set1_ps(scale[i][b]), total = _mm512_set1_ps(sum[i][b]);
      for (int j = 0; j < 4; ++j) {
        // Σ a·code = s_a · (Σ q·code + 2^-15 · Σ rest·code), the integer sums exact and
        // rounded once each to f32.
        const __m512 sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[i][j]), _mm512_set1_ps(1.f / 32768), _mm512_cvtepi32_ps(s[i][j]));
        acc[i][j] = _mm512_fmadd_ps(sums, _mm512_mul_ps(sa, gs[j]), acc[i][j]);
        acc[i][j] = _mm512_fmadd_ps(total, go[j], acc[i][j]);
      }
    }
  });
  for (int i = 0; i < MRT; ++i) {
    to_columns<W>(acc[i]);
    for (int j = 0; j < 4; ++j) {
      const __mmask16 mk = lanes16(w - j * 16);
      __m512 y = acc[i][j];
      if (bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mk, bias + j * 16));
      _mm512_mask_storeu_ps(c + i * ldc + j * 16, mk, y);
    }
  }
}

}  // namespace

void split_rows(int64_t m, int64_t k, int64_t group, const float* a, int64_t lda, std::byte* out) {
  const SplitA r(m, k, group);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = a + i * lda;
    int16_t *q = r.codes(out, i), *rest = r.rests(out, i);
    float* scale = r.scales(out, i);
    float* sums = r.sums(out, i);
    r.for_blocks([&](int64_t k0, int64_t end, int64_t, int64_t b) {
      __m512 most = _mm512_setzero_ps(), total = _mm512_setzero_ps();
      for (int64_t p = k0; p < end; p += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(lanes16(end - p), row + p);
        most = _mm512_max_ps(most, _mm512_abs_ps(v));
        total = _mm512_add_ps(total, v);
      }
      // vmaxps passes its second operand where either is NaN: `most` keeps a NaN of the row.
      const float top = _mm512_reduce_max_ps(most);
      // A block of zeros has the scale 0 (its codes 0); a NaN or an infinity in it makes the
      // scale NaN, so that the block's outputs are NaN (the f32 product's are NaN or infinite).
      const bool finite = std::isfinite(top);
      const __m512 inv = _mm512_set1_ps(top > 0 && finite ? 32767.f / top : 0.f);
      // q = round(a / s_a), then what q misses in 2^-15 steps: rest = round((a / s_a − q) · 2^15),
      // within ±2^14 (a / s_a is f32's product, and q within half a step of it).
      for (int64_t p = k0; p < end; p += 16) {
        const __mmask16 mk = lanes16(end - p);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, row + p), inv);
        const __m512i whole = _mm512_cvtps_epi32(x);
        const __m512 part = _mm512_mul_ps(_mm512_sub_ps(x, _mm512_cvtepi32_ps(whole)), _mm512_set1_ps(32768.f));
        _mm256_mask_storeu_epi16(q + p, mk, _mm512_cvtsepi32_epi16(whole));
        _mm256_mask_storeu_epi16(rest + p, mk, _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(part)));
      }
      scale[b] = finite ? top / 32767.f : std::numeric_limits<float>::quiet_NaN();
      sums[b] = _mm512_reduce_add_ps(total);
    });
    // An odd K's last pair reads one value more, against 8-bit codes that are the next bytes
    // of the panel (4-bit ones are zero padding): a 0 makes their products 0.
    if (k % 2) q[k] = rest[k] = 0;
  }
}

void split_panels(int64_t m, int64_t p0, int64_t p1, int64_t n, int64_t k, int64_t group, const std::byte* split,
                    const std::byte* b, WoqCodes codes, const Epilogue& ep, float* c, int64_t ldc) {
  using Tile = void (*)(const SplitA&, const std::byte*, const uint8_t*, const float*, const uint8_t*, const float*, float*,
                        int64_t, int);
  const Width width = codes == WoqCodes::s8 ? Width::s8 : codes == WoqCodes::u8 ? Width::u8 : Width::u4;
  const Tile one = width == Width::u4 ? &tile<Width::u4, 1> : width == Width::s8 ? &tile<Width::s8, 1> : &tile<Width::u8, 1>;
  const Tile two = width == Width::u4 ? &tile<Width::u4, 2> : width == Width::s8 ? &tile<Width::s8, 2> : &tile<Width::u8, 2>;
  const RowKernels& rows = row_kernels(Isa::avx512);
  const SplitA r(m, k, group);
  const int64_t stride = woq_avx512::panel_bytes(k, group, codes), params_at = woq_avx512::codes_bytes(k, codes);
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t n0 = panel * NR;
    const int w = static_cast<int>(std::min(NR, n - n0));
    const auto* bp = reinterpret_cast<const uint8_t*>(b + panel * stride);
    const auto* params = reinterpret_cast<const float*>(b + panel * stride + params_at);
    const uint8_t* next = panel + 1 < p1 ? bp + stride : nullptr;
    for (int64_t i0 = 0; i0 < m; i0 += 2) {
      const int64_t here = std::min<int64_t>(2, m - i0);
      (here == 2 ? two : one)(r, split + i0 * r.row_bytes(), bp, params, next, ep.bias ? ep.bias + n0 : nullptr, c + i0 * ldc + n0,
                              ldc, w);
      if (ep.has_tail())
        rows.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, here, w, ep.act, ep.post);
    }
  }
}

}  // namespace kiln::cpu::gemm::woq_vnni
