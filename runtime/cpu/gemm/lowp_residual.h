// The u8s8 epilogue's residual, for the files built with AVX-512 (lowp_avx512.cc, lowp_amx.cc).
#pragma once

#include <immintrin.h>

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

}  // namespace kiln::cpu::gemm
