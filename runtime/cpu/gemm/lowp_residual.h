// The u8s8 epilogue's last steps on registers, for the files built with AVX-512 (lowp_avx512.cc,
// lowp_amx.cc): the residual, ReLU and GELU, and the store (requantized, or f32).
#pragma once

#include <immintrin.h>

#include "runtime/cpu/erf.h"
#include "runtime/cpu/gemm/lowp.h"

namespace kiln::cpu::gemm {

/// The residual Z, its constants set once per block (the stores through uint8_t pointers
/// would otherwise have every value reload them from the epilogue): Z's values at row i,
/// columns [n, n + 16) (those in `mk`), as f32: read, or dequantized as z_scale · (q − z_zero).
struct U8s8Residual {
  explicit U8s8Residual(const QuantEpilogue& ep)
      : f32(ep.z_f32), q(static_cast<const uint8_t*>(ep.z_q)), ld(ep.ldz), s8(ep.z_s8), zero(_mm512_set1_epi32(ep.z_zero)),
        scale(_mm512_set1_ps(ep.z_scale)) {}
  __m512 at(int64_t i, int64_t n, __mmask16 mk) const {
    if (f32) return _mm512_maskz_loadu_ps(mk, f32 + i * ld + n);
    const __m128i b = _mm_maskz_loadu_epi8(mk, q + i * ld + n);
    const __m512i v = s8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(v, zero)), scale);
  }
  const float* f32;
  const uint8_t* q;
  int64_t ld;
  bool s8;
  __m512i zero;
  __m512 scale;
};

/// Whether the activations apply on the registers, value by value before the store: none, ReLU
/// or GELU before the residual, none or ReLU after it. Others go through a block of values and
/// the row kernels.
inline bool u8s8_on_registers(const QuantEpilogue& ep) {
  const Activation act = ep.act.kind, post = ep.post.kind;
  return (act == Activation::none || act == Activation::relu || act == Activation::gelu) &&
         (post == Activation::none || post == Activation::relu);
}

/// One of those activations on a register.
inline __m512 register_activation(Activation kind, __m512 y) {
  if (kind == Activation::relu) return _mm512_max_ps(y, _mm512_setzero_ps());
  if (kind == Activation::gelu) return erf_rational::gelu_erf(y);
  return y;
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
    if (u8 && mk == 0xffff)  // a plain store where it can: loads after masked ones wait for them
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint8_t*>(c) + i * ldc + n), _mm512_cvtepi32_epi8(q));
    else if (u8)
      _mm_mask_storeu_epi8(static_cast<uint8_t*>(c) + i * ldc + n, mk, _mm512_cvtepi32_epi8(q));
    else
      _mm512_mask_storeu_ps(static_cast<float*>(c) + i * ldc + n, mk, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, zero)), step));
  }
  __m512 inv, step;
  __m512i zero;
  bool u8, dq;
};

}  // namespace kiln::cpu::gemm
