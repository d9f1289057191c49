// One vector of floats for the polynomial kernels written once for both vector ISAs (the
// sigmoid family in logistic.inc, the exact GELU in erf.h): a zmm in the files built with
// AVX-512, a ymm in those built with AVX2 and FMA, with the few operations they need. Each
// including file gets its own copy (an unnamed namespace), built for its ISA.
#pragma once

#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
#error "vps.h needs AVX-512, or AVX2 with FMA"
#endif

#include <immintrin.h>

namespace kiln::cpu {
namespace {

#ifdef __AVX512F__
using Vps = __m512;
inline Vps vset(float f) { return _mm512_set1_ps(f); }
inline Vps vfma(Vps a, Vps b, Vps c) { return _mm512_fmadd_ps(a, b, c); }
inline Vps vmul(Vps a, Vps b) { return _mm512_mul_ps(a, b); }
inline Vps vadd(Vps a, Vps b) { return _mm512_add_ps(a, b); }
inline Vps vsub(Vps a, Vps b) { return _mm512_sub_ps(a, b); }
inline Vps vdiv(Vps a, Vps b) { return _mm512_div_ps(a, b); }
inline Vps vclamp(Vps v, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(v, vset(lo)), vset(hi)); }
// p·2^k for integral k (t: k + 1.5·2^23 as the rounding to k left it), by vscalefps.
inline Vps vscale2(Vps p, Vps k, Vps) { return _mm512_scalef_ps(p, k); }
#else
using Vps = __m256;
inline Vps vset(float f) { return _mm256_set1_ps(f); }
inline Vps vfma(Vps a, Vps b, Vps c) { return _mm256_fmadd_ps(a, b, c); }
inline Vps vmul(Vps a, Vps b) { return _mm256_mul_ps(a, b); }
inline Vps vadd(Vps a, Vps b) { return _mm256_add_ps(a, b); }
inline Vps vsub(Vps a, Vps b) { return _mm256_sub_ps(a, b); }
inline Vps vdiv(Vps a, Vps b) { return _mm256_div_ps(a, b); }
inline Vps vclamp(Vps v, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(v, vset(lo)), vset(hi)); }
// p·2^k for integral k where the product is a normal float, given t = k + 1.5·2^23 as the
// rounding to k left it: t's low mantissa bits hold k (two's complement), so t's bits shifted
// up 23 are k in the exponent field's place, added to p's exponent as integers. Two integer
// operations where building 2^k and multiplying took four (a conversion, an add, a shift and a
// vmulps on an FMA port): in L1 on a Zen 3 core, the old and new ways alternated (medians of
// 41), SiLU 0.88 of its time, the tanh GELU 0.91, Sigmoid 0.99 and the softmax's e^x (exp8)
// 0.90, with the same bits wherever p·2^k is normal.
inline Vps vscale2(Vps p, Vps, Vps t) {
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}
#endif

}  // namespace
}  // namespace kiln::cpu
