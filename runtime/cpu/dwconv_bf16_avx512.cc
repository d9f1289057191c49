// The channels-last depthwise convolution on bf16 activations (dwconv_bf16.h), built with
// AVX512-BF16 (CMake sets the flags for this file); dwconv.cc calls it only on CPUs that have it.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "runtime/cpu/dwconv_bf16.h"
#include "runtime/cpu/rows.h"
#include "runtime/cpu/vps.h"

namespace kiln::cpu::dwbf16 {

namespace {

// SiLU a vector at a time, as the row kernels compute it.
#include "runtime/cpu/logistic.inc"

inline __m512 from_bf16(__m256i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)); }

// 16 channels of a pixel in f32: bf16 widened (exact), or f32 rounded to bf16's precision (as
// a bf16 weight's products take an f32 input).
inline __m512 load(const uint16_t* p) { return from_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load(const float* p) { return from_bf16((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p))); }

// The activation on a vector of sums, then stored: rounded to bf16 (nearest even), or f32.
template <Activation A, class Y>
inline void finish(__m512 v, const ActivationSpec& act, Y* out) {
  if constexpr (A == Activation::relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
  if constexpr (A == Activation::clip) v = vclamp(v, act.a, act.b);
  if constexpr (A == Activation::silu) v = logistic<Activation::silu>(v);
  if constexpr (std::is_same_v<Y, float>) _mm512_storeu_ps(out, v);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(v));
}

// The rows of one output row: in[i] is the input row under filter row i, null where it lies in
// the padding.
template <int K, class X>
using Rows = const X* const (&)[K];

// NC adjacent output columns from j whose taps all lie inside the image, channels [cb, cb + 16):
// rows.inc's dwconv_columns (and edge_column its dwconv_edge_column) with loads that convert,
// which the row kernels' builds, without AVX512-BF16, cannot emit. Each filter row's K weights
// stay in registers and each input column is loaded (and brought to f32) once for all the
// output columns that read it.
template <int NC, int K, int S, Activation A, class X, class Y>
inline void columns(const Params& p, Rows<K, X> in, __m512 bias, int64_t j, int64_t cb, Y* out) {
  const int64_t c = p.c;
  __m512 acc[NC];
#pragma GCC unroll 8
  for (int n = 0; n < NC; ++n) acc[n] = bias;
  for (int i = 0; i < K; ++i) {
    if (!in[i]) continue;
    const float* f = p.filters + i * K * c + cb;
    __m512 wv[K];
#pragma GCC unroll 5
    for (int k = 0; k < K; ++k) wv[k] = _mm512_loadu_ps(f + k * c);
    const X* x = in[i] + (j * S - p.pl) * c + cb;
#pragma GCC unroll 32
    for (int q = 0; q < (NC - 1) * S + K; ++q) {
      const __m512 v = load(x + q * c);
#pragma GCC unroll 5
      for (int k = 0; k < K; ++k)
        if (q - k >= 0 && (q - k) % S == 0 && (q - k) / S < NC) acc[(q - k) / S] = _mm512_fmadd_ps(wv[k], v, acc[(q - k) / S]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < NC; ++n) finish<A>(acc[n], p.act, out + (j + n) * c + cb);
}

// Output column j over its taps inside the image only (a column at the left or right edge):
// each filter column's taps summed apart, so that the FMAs form K short chains rather than one
// of every tap, which would wait on each FMA's latency (on 7-column rows, four of the columns
// are edges of a 5x5 filter).
template <int K, Activation A, class X, class Y>
inline void edge_column(const Params& p, Rows<K, X> in, __m512 bias, int64_t j, int64_t cb, Y* out) {
  const int64_t c = p.c, col = j * p.s - p.pl, k0 = std::max<int64_t>(0, -col), k1 = std::min<int64_t>(K, p.w - col);
  __m512 acc[K];
#pragma GCC unroll 5
  for (int k = 0; k < K; ++k) acc[k] = _mm512_setzero_ps();
  for (int i = 0; i < K; ++i) {
    if (!in[i]) continue;
    const float* f = p.filters + i * K * c + cb;
    const X* x = in[i] + col * c + cb;
#pragma GCC unroll 5
    for (int k = 0; k < K; ++k)
      if (k >= k0 && k < k1) acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(f + k * c), load(x + k * c), acc[k]);
  }
#pragma GCC unroll 5
  for (int k = 0; k < K; ++k) bias = _mm512_add_ps(bias, acc[k]);
  finish<A>(bias, p.act, out + j * c + cb);
}

template <int K, int S, Activation A, class X, class Y>
void rows_of(const Params& p, const X* x, const float* bias, Y* y, int64_t o0, int64_t o1) {
  const int64_t c = p.c;
  const auto [j0, j1] = dwconv_inside_columns(p.w, K, S, p.pl, p.ow);
  auto bias_at = [&](int64_t cb) { return bias ? _mm512_loadu_ps(bias + cb) : _mm512_setzero_ps(); };
  for (int64_t o = o0; o < o1; ++o) {
    const int64_t r0 = o * S - p.pt;
    const X* in[K];
    for (int64_t i = 0; i < K; ++i) in[i] = r0 + i >= 0 && r0 + i < p.h ? x + (r0 + i) * p.w * c : nullptr;
    Y* out = y + o * p.ow * c;
    auto edge = [&](int64_t j) {
      for (int64_t cb = 0; cb < c; cb += kLanes) edge_column<K, A>(p, in, bias_at(cb), j, cb, out);
    };
    for (int64_t j = 0; j < j0; ++j) edge(j);
    // The inside columns eight at a time, every vector of channels of a block before the next
    // block (the block's input window, K rows of 7·S + K pixels, stays in L1), then the rest.
    int64_t j = j0;
    for (; j + 8 <= j1; j += 8)
      for (int64_t cb = 0; cb < c; cb += kLanes) columns<8, K, S, A>(p, in, bias_at(cb), j, cb, out);
    for (const int n : {4, 2, 1})
      if (j + n <= j1) {
        for (int64_t cb = 0; cb < c; cb += kLanes) {
          if (n == 4) columns<4, K, S, A>(p, in, bias_at(cb), j, cb, out);
          else if (n == 2) columns<2, K, S, A>(p, in, bias_at(cb), j, cb, out);
          else columns<1, K, S, A>(p, in, bias_at(cb), j, cb, out);
        }
        j += n;
      }
    for (j = j1; j < p.ow; ++j) edge(j);
  }
}

template <int K, int S, class X, class Y>
void rows_by_activation(const Params& p, const X* x, const float* bias, Y* y, int64_t o0, int64_t o1) {
  switch (p.act.kind) {
    case Activation::relu: return rows_of<K, S, Activation::relu>(p, x, bias, y, o0, o1);
    case Activation::clip: return rows_of<K, S, Activation::clip>(p, x, bias, y, o0, o1);
    case Activation::silu: return rows_of<K, S, Activation::silu>(p, x, bias, y, o0, o1);
    default: return rows_of<K, S, Activation::none>(p, x, bias, y, o0, o1);
  }
}

template <class X, class Y>
void rows_by_window(const Params& p, const X* x, const float* bias, Y* y, int64_t o0, int64_t o1) {
  if (p.k == 5) rows_by_activation<5, 2>(p, x, bias, y, o0, o1);
  else if (p.s == 2) rows_by_activation<3, 2>(p, x, bias, y, o0, o1);
  else rows_by_activation<3, 1>(p, x, bias, y, o0, o1);
}

template <class X>
void rows_from(const Params& p, const X* x, const float* bias, void* y, int64_t o0, int64_t o1) {
  if (p.y_bf16) rows_by_window(p, x, bias, static_cast<uint16_t*>(y), o0, o1);
  else rows_by_window(p, x, bias, static_cast<float*>(y), o0, o1);
}

}  // namespace

void rows(const Params& p, const void* x, const float* bias, void* y, int64_t o0, int64_t o1) {
  if (p.x_bf16) rows_from(p, static_cast<const uint16_t*>(x), bias, y, o0, o1);
  else rows_from(p, static_cast<const float*>(x), bias, y, o0, o1);
}

}  // namespace kiln::cpu::dwbf16
