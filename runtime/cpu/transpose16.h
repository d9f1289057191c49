// A 16x16 block of 32-bit elements transposed in AVX-512 registers, for the files built with
// AVX-512: the row kernels' transpose (floats; attention's Kᵀ panels) and the AMX attention's
// Kᵀ tiles (pairs of bf16 as one word). Unpacks of 32- then 64-bit elements, then two rounds
// of 128-bit lane shuffles.
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

namespace kiln::cpu {
namespace {  // each including file's own copy: they are built for different ISAs

/// r[i] holds row i of the block on entry and column i on return.
inline void transpose16x16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // r[4g + c]: rows 4g..4g+3 at columns c, c + 4, c + 8, c + 12
    r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);           // rows 0-7, columns c and c + 8
    t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);       // rows 0-7, columns c + 4 and c + 12
    t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);  // rows 8-15, the same
    t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD);
    r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD);
  }
}

}  // namespace
}  // namespace kiln::cpu
#endif
