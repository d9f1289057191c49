// The u8s8 epilogue's last steps on registers, for the files built with AVX-512 (lowp_avx512.cc,
// lowp_amx.cc): the residual, GELU, and the store (requantized, or f32).
#pragma once

#include <immintrin.h>

#include "runtime/cpu/erf.h"
#include "runtime/cpu/gemm/lowp.h"

namespace kiln::cpu::gemm {

/// Z's values at row i, columns [n, n + 16) (those in `mk`), as f32: read, or dequantized as
/// z_scale · (q − z_zero).
inline __m512 u8s8_residual(const QuantEpilogue& ep, int64_t i, int64_t n, __mmask16 mk) {
  if (ep.z_f32) return _mm512_maskz_loadu_ps(mk, ep.z_f32 + i * ep.ldz + n);
  const __m128i q = _mm_maskz_loadu_epi8(mk, static_cast<const uint8_t*>(ep.z_q) + i * ep.ldz + n);
  const __m512i v = ep.z_s8 ? _mm512_cvtepi8_epi32(q) : _mm512_cvtepu8_epi32(q);
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(ep.z_zero))), _mm512_set1_ps(ep.z_scale));
}

/// Whether the activations apply on the registers, value by value before the store: none, or
/// GELU before the residual. Others go through a block of values and the row kernels.
inline bool u8s8_on_registers(const QuantEpilogue& ep) {
  return (ep.act.kind == Activation::none || ep.act.kind == Activation::gelu) && ep.post.kind == Activation::none;
}

/// The output's constants, set once per block: y at C's row i, columns [n, n + 16) (those in
/// `mk`) stored as f32, or requantized (rounded half to even, the MXCSR default; the zero point
/// added; saturated to 0..255) to u8, or to u8 and dequantized again (`out_dq`).
struct U8s8Out {
  explicit U8s8Out(const QuantEpilogue& ep)
      : inv(_mm512_set1_ps(1.f / ep.out_scale)), step(_mm512_set1_ps(ep.out_scale)), zero(_mm512_set1_epi32(ep.out_zero)),
        u8(ep.out_u8), dq(ep.out_dq) {}
  void store(__m512 y, void* c, int64_t ldc, int64_t i, int64_t n, __mmask16 mk) const {
    if (!u8 && !dq) {
      _mm512_mask_storeu_ps(static_cast<float*>(c) + i * ldc + n, mk, y);
      return;
    }
    __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(y, inv)), zero);
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_setzero_si512()), _mm512_set1_epi32(255));
    if (u8)
      _mm_mask_storeu_epi8(static_cast<uint8_t*>(c) + i * ldc + n, mk, _mm512_cvtepi32_epi8(q));
    else
      _mm512_mask_storeu_ps(static_cast<float*>(c) + i * ldc + n, mk, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, zero)), step));
  }
  __m512 inv, step;
  __m512i zero;
  bool u8, dq;
};

}  // namespace kiln::cpu::gemm
