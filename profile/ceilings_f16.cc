// The ceilings probe's AVX512-FP16 loop (ceilings_f16.h); CMake builds this file with the flags.
#include "profile/ceilings_f16.h"

#include <immintrin.h>

namespace kiln::profile {

float f16_fma_loop(long iters) {
  __m512h acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ph(static_cast<_Float16>(i * 1e-3f));
  const __m512h a = _mm512_set1_ph(static_cast<_Float16>(0.999f)), b = _mm512_set1_ph(static_cast<_Float16>(1e-4f));
  for (long n = 0; n < iters; ++n)
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ph(acc[i], a, b);
  __m512h s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ph(s, acc[i]);
  _Float16 lanes[32];
  _mm512_storeu_ph(lanes, s);
  float sum = 0;
  for (_Float16 l : lanes) sum += static_cast<float>(l);
  return sum;
}

}  // namespace kiln::profile
