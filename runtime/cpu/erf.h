// erf as a ratio of odd and even polynomials in x on [-4, 4] (beyond, erf is ±1 to f32
// precision): the rational approximation Eigen and XLA use, within a few ulp. The files built
// with AVX2 or AVX-512 get GELU on a register from it (gelu_erf, over vps.h's vector), which
// the row kernels' GELU and the u8s8 GEMMs' epilogues share, so a GEMM's GELU is applied before
// requantizing rather than through a buffer and matches the row kernel's to the bit. On AVX2
// it replaced the row kernels' scalar erf that the compiler vectorised (its min and max as
// compares and blends): 0.79-0.85 of that GELU's time on BERT-base's and ViT-S/16's rows (a
// Zen 3 core, alternated).
#pragma once

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include "runtime/cpu/vps.h"
#endif

namespace kiln::cpu::erf_rational {

inline constexpr float kBound = 4.f;
// erf(x) = x · P(x²) / Q(x²), highest power first.
inline constexpr float kP[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f, -5.69250639462346e-05f,
                                -7.34990630326855e-04f, -2.95459980854025e-03f, -1.60960333262415e-02f};
inline constexpr float kQ[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f, -7.37332916720468e-03f,
                                -1.42647390514189e-02f};

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
namespace {  // each including file's own copy: they are built for different ISAs

/// 0.5·x·(1 + erf(x / √2)) in each lane.
inline Vps gelu_erf(Vps v) {
  const Vps x = vclamp(vmul(v, vset(0.7071067811865476f)), -kBound, kBound);
  const Vps x2 = vmul(x, x);
  Vps p = vset(kP[0]), q = vset(kQ[0]);
  for (int i = 1; i < 7; ++i) p = vfma(p, x2, vset(kP[i]));
  for (int i = 1; i < 5; ++i) q = vfma(q, x2, vset(kQ[i]));
  const Vps half = vmul(v, vset(0.5f));
  return vfma(half, vdiv(vmul(x, p), q), half);
}

}  // namespace
#endif

}  // namespace kiln::cpu::erf_rational
