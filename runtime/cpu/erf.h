// erf as a ratio of odd and even polynomials in x on [-4, 4] (beyond, erf is ±1 to f32
// precision): the rational approximation Eigen and XLA use, within a few ulp. The row kernels
// take it in scalar form (rows.inc's fast_erf, which the compiler vectorises); the files built
// with AVX-512 also get GELU on a register from it (gelu_erf), which the row kernels' GELU and
// the u8s8 GEMMs' epilogues share, so a GEMM's GELU is applied before requantizing rather than
// through a buffer and matches the row kernel's to the bit.
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace kiln::cpu::erf_rational {

inline constexpr float kBound = 4.f;
// erf(x) = x · P(x²) / Q(x²), highest power first.
inline constexpr float kP[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f, -5.69250639462346e-05f,
                                -7.34990630326855e-04f, -2.95459980854025e-03f, -1.60960333262415e-02f};
inline constexpr float kQ[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f, -7.37332916720468e-03f,
                                -1.42647390514189e-02f};

#ifdef __AVX512F__
namespace {  // each including file's own copy: they are built for different ISAs

/// 0.5·x·(1 + erf(x / √2)) in each lane.
inline __m512 gelu_erf(__m512 v) {
  __m512 x = _mm512_mul_ps(v, _mm512_set1_ps(0.7071067811865476f));
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-kBound)), _mm512_set1_ps(kBound));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(kP[0]), q = _mm512_set1_ps(kQ[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(kP[i]));
  for (int i = 1; i < 5; ++i) q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(kQ[i]));
  const __m512 half = _mm512_mul_ps(v, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(half, _mm512_div_ps(_mm512_mul_ps(x, p), q), half);
}

}  // namespace
#endif

}  // namespace kiln::cpu::erf_rational
