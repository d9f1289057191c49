// The u8s8 epilogue's last steps on registers, for the files built with AVX-512 (lowp_avx512.cc,
// lowp_amx.cc): the residual, ReLU and GELU, and the store (requantized, or f32).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

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
  [[gnu::always_inline]] __m512 at(int64_t i, int64_t n, __mmask16 mk) const {
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

/// Whether an activation applies on the registers, value by value: none, ReLU, LeakyReLU, Clip
/// (ReLU6) and GELU. (SiLU and Sigmoid do not: on the registers, next to the tile's other sums,
/// logistic.inc's SiLU made int8 EfficientNet-B0's expansions 1.2-1.36x slower than through
/// the block, 12544x96x16 417 against 307 µs, one thread on a Zen 5 core, 5 alternated
/// profiles; the SiLU itself costs about 0.11 ns a value there. Measured again on a 2-core
/// Xeon, family 6 model 207, one thread, 6 alternated profiles: int8 EfficientNet-B0's and
/// YOLO's expansions 1.13-1.18x slower on the registers there too.)
inline bool on_registers(Activation kind) {
  return kind == Activation::none || kind == Activation::relu || kind == Activation::leaky_relu || kind == Activation::clip ||
         kind == Activation::gelu;
}

/// Whether the epilogue's activations apply on the registers, value by value before the store:
/// one of those before the residual and after it. Others go through a block of values and the
/// row kernels.
inline bool u8s8_on_registers(const QuantEpilogue& ep) { return on_registers(ep.act.kind) && on_registers(ep.post.kind); }

/// One of those activations on a register, as runtime/ref/activation.h computes it (`vmaxps` and
/// `vminps` return their second operand where either is NaN: y second, a NaN passes).
inline __m512 register_activation(const ActivationSpec& a, __m512 y) {
  switch (a.kind) {
    case Activation::relu: return _mm512_max_ps(_mm512_setzero_ps(), y);
    case Activation::leaky_relu: return _mm512_mask_mul_ps(y, _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ), y, _mm512_set1_ps(a.a));
    case Activation::clip: return _mm512_min_ps(_mm512_set1_ps(a.b), _mm512_max_ps(_mm512_set1_ps(a.a), y));
    case Activation::gelu: return erf_rational::gelu_erf(y);
    default: return y;
  }
}

/// The output's constants, set once per block: y at C's row i, columns [n, n + 16) (those in
/// `mk`) stored as f32, or requantized (rounded half to even, the MXCSR default; the zero point
/// added; saturated to 0..255) to u8, or to u8 and dequantized again (`out_dq`).
struct U8s8Out {
  explicit U8s8Out(const QuantEpilogue& ep)
      : inv(_mm512_set1_ps(1.f / ep.out_scale)), step(_mm512_set1_ps(ep.out_scale)), zero(_mm512_set1_epi32(ep.out_zero)),
        u8(ep.out_u8), dq(ep.out_dq) {}
  /// y's code before saturation: y / scale rounded, plus the zero point.
  [[gnu::always_inline]] __m512i code(__m512 y) const { return _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(y, inv)), zero); }
  /// Codes already within 0..255 stored as u8.
  [[gnu::always_inline]] static void store_u8(__m512i q, void* c, int64_t ldc, int64_t i, int64_t n, __mmask16 mk) {
    uint8_t* to = static_cast<uint8_t*>(c) + i * ldc + n;
    if (mk == 0xffff)  // a plain store where it can: loads after masked ones wait for them
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to), _mm512_cvtepi32_epi8(q));
    else
      _mm_mask_storeu_epi8(to, mk, _mm512_cvtepi32_epi8(q));
  }
  [[gnu::always_inline]] void store(__m512 y, void* c, int64_t ldc, int64_t i, int64_t n, __mmask16 mk) const {
    if (!u8 && !dq) {
      _mm512_mask_storeu_ps(static_cast<float*>(c) + i * ldc + n, mk, y);
      return;
    }
    const __m512i q = _mm512_min_epi32(_mm512_max_epi32(code(y), _mm512_setzero_si512()), _mm512_set1_epi32(255));
    if (u8)
      store_u8(q, c, ldc, i, n, mk);
    else
      _mm512_mask_storeu_ps(static_cast<float*>(c) + i * ldc + n, mk, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, zero)), step));
  }
  __m512 inv, step;
  __m512i zero;
  bool u8, dq;
};

/// The epilogue's last steps where they apply on the registers (u8s8_on_registers): a row's
/// C values y[j] (columns n + 16j, those in mk[j]; j < nv) at row i, the residual read for all
/// of them first (Y may be Z's memory), then the activation, the residual, the post activation
/// and the store.
struct U8s8Finish {
  explicit U8s8Finish(const QuantEpilogue& ep) : act(ep.act), post(ep.post), residual(ep.has_z()), z(ep), out(ep) {
    // ReLU, Clip or nothing and no more: the activation is a clamp, without a branch a value;
    // with a u8 output, a clamp of the codes (requantizing is monotonic, so clamping y to
    // [lo, hi] and then requantizing is clamping the code to the codes of lo and hi).
    const Activation k = act.kind;
    clamp = !residual && post.kind == Activation::none && (k == Activation::none || k == Activation::relu || k == Activation::clip);
    const float inf = std::numeric_limits<float>::infinity();
    const float l = k == Activation::clip ? act.a : k == Activation::relu ? 0.f : -inf, h = k == Activation::clip ? act.b : inf;
    lo = _mm512_set1_ps(l);
    hi = _mm512_set1_ps(h);
    if (ep.out_u8) {
      code_lo = _mm512_set1_epi32(bound_code(l, ep));
      code_hi = _mm512_set1_epi32(bound_code(h, ep));
    }
  }
  /// A bound's code as U8s8Out::code makes it (the product by 1 / scale in f32, rounded to
  /// nearest even as `vcvtps2dq` does under the default MXCSR), within 0..255; a bound beyond
  /// int32 (an infinite one, or FLT_MAX for no bound) saturates by its sign.
  static int32_t bound_code(float v, const QuantEpilogue& ep) {
    const float t = v * (1.f / ep.out_scale);
    if (!(std::fabs(t) < 2e9f)) return t < 0 ? 0 : 255;
    return static_cast<int32_t>(std::clamp<long>(std::lrint(t) + ep.out_zero, 0, 255));
  }
  /// Whether the epilogue is that clamp of the codes: code_row finishes each value.
  bool codes() const { return clamp && out.u8; }
  /// A value's code clamped and stored as u8 (where codes()).
  [[gnu::always_inline]] void code_row(__m512 y, void* c, int64_t ldc, int64_t i, int64_t n, __mmask16 mk) const {
    U8s8Out::store_u8(_mm512_min_epi32(code_hi, _mm512_max_epi32(code_lo, out.code(y))), c, ldc, i, n, mk);
  }
  /// The same from y already in the codes' units with the zero point added (y / scale + zero:
  /// the sums' scale and bias folded with the output's), rounded, clamped and stored.
  [[gnu::always_inline]] void folded_code_row(__m512 y, void* c, int64_t ldc, int64_t i, int64_t n, __mmask16 mk) const {
    U8s8Out::store_u8(_mm512_min_epi32(code_hi, _mm512_max_epi32(code_lo, _mm512_cvtps_epi32(y))), c, ldc, i, n, mk);
  }
  template <int NV>
  [[gnu::always_inline]] void row(__m512 (&y)[NV], int nv, void* c, int64_t ldc, int64_t i, int64_t n, const __mmask16 (&mk)[NV]) const {
    if (codes()) {
      for (int j = 0; j < nv; ++j) code_row(y[j], c, ldc, i, n + j * 16, mk[j]);
      return;
    }
    if (clamp) {
      for (int j = 0; j < nv; ++j) out.store(_mm512_min_ps(hi, _mm512_max_ps(lo, y[j])), c, ldc, i, n + j * 16, mk[j]);
      return;
    }
    __m512 zv[NV];
    if (residual)
      for (int j = 0; j < nv; ++j) zv[j] = z.at(i, n + j * 16, mk[j]);
    for (int j = 0; j < nv; ++j) {
      __m512 v = register_activation(act, y[j]);
      if (residual) v = _mm512_add_ps(v, zv[j]);
      out.store(register_activation(post, v), c, ldc, i, n + j * 16, mk[j]);
    }
  }
  ActivationSpec act, post;
  bool residual, clamp;
  __m512 lo, hi;
  __m512i code_lo = _mm512_setzero_si512(), code_hi = _mm512_set1_epi32(255);
  U8s8Residual z;
  U8s8Out out;
};

/// The u8 epilogues most convolutions end with, nothing in them decided a value: clamps (none,
/// ReLU or Clip) around an 8-bit Z, a ResNet block's end (none, then ReLU), or one clamp and no
/// Z. Its constants are vectors of its own, which a row's stores leave in the registers
/// (U8s8Finish::row asks its flags and kinds again at every value, and reloads them after every
/// byte store), and two vectors of a row's codes go to C in one store. The same arithmetic as
/// U8s8Finish::row, so the same codes: the activation before Z as its clamp (ReLU's
/// `max(0, y)` is `min(+inf, max(0, y))`: y is never NaN, its sums are integers), the last one
/// as a clamp of the codes (requantizing is monotonic, as in U8s8Finish::code_row).
struct U8s8Clamped {
  /// Z's kind: none, u8 or s8 codes.
  enum Z { none, u8, s8 };
  static bool clamps(Activation k) { return k == Activation::none || k == Activation::relu || k == Activation::clip; }
  static bool applies(const QuantEpilogue& ep) {
    return ep.out_u8 && !ep.out_dq && !ep.z_f32 && clamps(ep.act.kind) && clamps(ep.post.kind) &&
           (ep.z_q || ep.post.kind == Activation::none);
  }
  static Z z_kind(const QuantEpilogue& ep) { return !ep.z_q ? none : ep.z_s8 ? s8 : u8; }
  /// Whether a clamp comes before Z (the row's `ActClamp`).
  static bool act_clamps(const QuantEpilogue& ep) { return ep.z_q && ep.act.kind != Activation::none; }
  static float low(const ActivationSpec& a) {
    return a.kind == Activation::clip ? a.a : a.kind == Activation::relu ? 0.f : -std::numeric_limits<float>::infinity();
  }
  static float high(const ActivationSpec& a) { return a.kind == Activation::clip ? a.b : std::numeric_limits<float>::infinity(); }
  explicit U8s8Clamped(const QuantEpilogue& ep)
      : act_lo(_mm512_set1_ps(low(ep.act))), act_hi(_mm512_set1_ps(high(ep.act))), z_zero(_mm512_set1_epi32(ep.z_zero)),
        z_scale(_mm512_set1_ps(ep.z_scale)), inv(_mm512_set1_ps(1.f / ep.out_scale)), zero(_mm512_set1_epi32(ep.out_zero)),
        z(static_cast<const uint8_t*>(ep.z_q)), ldz(ep.ldz) {
    const ActivationSpec& last = ep.z_q ? ep.post : ep.act;
    const int32_t lo = U8s8Finish::bound_code(low(last), ep), hi = U8s8Finish::bound_code(high(last), ep);
    code_lo = _mm512_set1_epi32(lo);
    code_hi = _mm512_set1_epi32(hi);
    narrow = lo > 0 || hi < 255;
  }
  /// Row i's values y[j] (columns n + 16j, those in mk[j]) finished and stored: Z's values read
  /// first (Y may be Z's memory).
  template <bool ActClamp, Z ZK, int NV>
  [[gnu::always_inline]] void row(__m512 (&y)[NV], int nv, uint8_t* c, int64_t ldc, int64_t i, int64_t n, const __mmask16 (&mk)[NV]) const {
    if constexpr (NV == 2) {
      if (nv == 2) {  // two vectors' codes in one store (masked where the second is partial)
        const bool whole = (mk[0] & mk[1]) == 0xffff;  // Z's then read unmasked
        __m512i code[2];
        codes<ActClamp, ZK>(y, code, 2, z_row<ZK>(i, n), whole ? nullptr : mk);
        if (narrow)
          for (int j = 0; j < 2; ++j) code[j] = _mm512_min_epi32(code_hi, _mm512_max_epi32(code_lo, code[j]));
        // Saturated to 0..255 by the packs (the clamp where the bounds are 0 and 255). Each 128-bit
        // lane L of them holds columns 4L..4L+3 of both vectors (dwords 0 and 1): the dwords in
        // column order.
        const __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(code[0], code[1]), _mm512_setzero_si512());
        const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
        const __m256i row = _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, bytes));
        auto* to = reinterpret_cast<__m256i*>(c + i * ldc + n);
        if (whole)
          _mm256_storeu_si256(to, row);
        else
          _mm256_mask_storeu_epi8(to, static_cast<__mmask32>(mk[0]) | static_cast<__mmask32>(mk[1]) << 16, row);
        return;
      }
    }
    __m512i code[NV];
    codes<ActClamp, ZK>(y, code, nv, z_row<ZK>(i, n), mk);
    for (int j = 0; j < nv; ++j) U8s8Out::store_u8(_mm512_min_epi32(code_hi, _mm512_max_epi32(code_lo, code[j])), c, ldc, i, n + j * 16, mk[j]);
  }
  /// Z's row i from column n (none without Z: no offset on a null pointer).
  template <Z ZK>
  [[gnu::always_inline]] const uint8_t* z_row(int64_t i, int64_t n) const {
    if constexpr (ZK == none) return nullptr;
    return z + i * ldz + n;
  }
  /// Z's product and its sum with y each rounded (the explicit rounding keeps GCC from fusing
  /// them into one FMA, which U8s8Finish::row's do not get either: a code may round the other
  /// way after one).
  static constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  /// The codes of y[j] (+ Z's values at zr + 16j: those in mk[j], all without `mk`), unclamped.
  template <bool ActClamp, Z ZK, int NV>
  [[gnu::always_inline]] void codes(const __m512 (&y)[NV], __m512i (&code)[NV], int nv, const uint8_t* zr, const __mmask16* mk) const {
    __m512 zv[NV];
    if constexpr (ZK != none)
      for (int j = 0; j < nv; ++j) {
        const __m128i b = mk ? _mm_maskz_loadu_epi8(mk[j], zr + j * 16) : _mm_loadu_si128(reinterpret_cast<const __m128i*>(zr + j * 16));
        const __m512i q = ZK == s8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
        zv[j] = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, z_zero)), z_scale, kNearest);
      }
    for (int j = 0; j < nv; ++j) {
      __m512 v = y[j];
      if constexpr (ActClamp) v = _mm512_min_ps(act_hi, _mm512_max_ps(act_lo, v));
      if constexpr (ZK != none) v = _mm512_add_round_ps(v, zv[j], kNearest);
      code[j] = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), zero);
    }
  }
  __m512 act_lo, act_hi;
  __m512i z_zero;
  __m512 z_scale, inv;
  __m512i zero, code_lo, code_hi;
  const uint8_t* z;
  int64_t ldz;
  bool narrow;  ///< the codes' bounds inside 0..255 (else the packs' saturation is the clamp)
};

}  // namespace kiln::cpu::gemm
