// DType names and the 16-bit float conversions.
#include "formats/dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace kiln {

half::half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) {  // inf or nan
    bits = static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
    return;
  }
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) { bits = static_cast<uint16_t>(sign | 0x7c00u); return; }
  if (e <= 0) {  // subnormal or zero: round to nearest even
    if (e < -10) { bits = static_cast<uint16_t>(sign); return; }
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1))) ++half_mant;
    bits = static_cast<uint16_t>(sign | half_mant);
    return;
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // may carry into exponent: correct
  bits = static_cast<uint16_t>(h);
}

half::operator float() const {
  uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1f;
  uint32_t mant = bits & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal
      float f = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -f : f;
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(x);
}

bfloat16::bfloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) { bits = static_cast<uint16_t>((x >> 16) | 0x40); return; }
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1);
  bits = static_cast<uint16_t>((x + rounding) >> 16);
}

bfloat16::operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

size_t dtype_size(DType t) {
  switch (t) {
#define KILN_DTYPE_SIZE(e, v, n, T) \
  case DType::e: return sizeof(T);
    KILN_DTYPES(KILN_DTYPE_SIZE)
#undef KILN_DTYPE_SIZE
    default: return 0;
  }
}

std::optional<size_t> storage_bytes(DType t, int64_t numel) {
  if (numel < 0) return std::nullopt;
  const auto n = static_cast<uint64_t>(numel);
  if (is_int4(t)) return static_cast<size_t>((n + 1) / 2);
  const size_t es = dtype_size(t);
  if (es && n > SIZE_MAX / es) return std::nullopt;
  return static_cast<size_t>(n) * es;
}

std::string_view dtype_name(DType t) {
  switch (t) {
#define KILN_DTYPE_NAME(e, v, n, T) \
  case DType::e: return n;
    KILN_DTYPES(KILN_DTYPE_NAME)
    KILN_INT4_DTYPES(KILN_DTYPE_NAME)
#undef KILN_DTYPE_NAME
    default: return "undefined";
  }
}

std::optional<DType> dtype_from_name(std::string_view name) {
#define KILN_DTYPE_FROM(e, v, n, T) \
  if (name == n) return DType::e;
  KILN_DTYPES(KILN_DTYPE_FROM)
  KILN_INT4_DTYPES(KILN_DTYPE_FROM)
#undef KILN_DTYPE_FROM
  return std::nullopt;
}

bool dtype_valid(uint16_t raw) { return raw >= 1 && raw <= 15; }

}  // namespace kiln
