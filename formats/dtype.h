// Element types. The numeric values are stored in .kiln files: append only, never renumber.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kiln {

// X(enumerator, value, name, C++ storage type)
#define KILN_DTYPES(X)                \
  X(f32, 1, "f32", float)             \
  X(f16, 2, "f16", ::kiln::half)      \
  X(bf16, 3, "bf16", ::kiln::bfloat16)\
  X(f64, 4, "f64", double)            \
  X(i8, 5, "i8", int8_t)              \
  X(u8, 6, "u8", uint8_t)             \
  X(i16, 7, "i16", int16_t)           \
  X(u16, 8, "u16", uint16_t)          \
  X(i32, 9, "i32", int32_t)           \
  X(u32, 10, "u32", uint32_t)         \
  X(i64, 11, "i64", int64_t)          \
  X(u64, 12, "u64", uint64_t)         \
  X(boolean, 13, "bool", bool)

/// IEEE binary16, stored as bits; converts through float.
struct half {
  uint16_t bits = 0;
  half() = default;
  half(float f);  // NOLINT: implicit like a built-in float type
  operator float() const;  // NOLINT
};

/// bfloat16 (upper half of a float32), stored as bits; rounds to nearest even.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f);  // NOLINT
  operator float() const;  // NOLINT
};

// The 4-bit integer types (weight-only quantization's storage): X(enumerator, value, name,
// signed). Two elements per byte, element 2i in the low nibble of byte i (ONNX's order); no
// C++ type holds one, so visit_dtype does not take them: the few readers that do (the
// quantize / dequantize ops, tensor I/O, the weight-only matmul) read them with int4_at.
#define KILN_INT4_DTYPES(X) \
  X(i4, 14, "i4", true)     \
  X(u4, 15, "u4", false)

enum class DType : uint16_t {
  undefined = 0,
#define KILN_DTYPE_ENUM(e, v, n, T) e = v,
  KILN_DTYPES(KILN_DTYPE_ENUM)
  KILN_INT4_DTYPES(KILN_DTYPE_ENUM)
#undef KILN_DTYPE_ENUM
};

/// Bytes per element (bool is one byte); 0 for undefined and the 4-bit types, whose elements
/// are not whole bytes (storage_bytes counts a tensor's bytes for every type).
size_t dtype_size(DType t);
/// i4 or u4.
inline bool is_int4(DType t) { return t == DType::i4 || t == DType::u4; }
/// Bytes `numel` elements of `t` occupy: numel · dtype_size, or ceil(numel / 2) for the 4-bit
/// types; nullopt when numel is negative or the count overflows.
std::optional<size_t> storage_bytes(DType t, int64_t numel);
/// Element i of 4-bit data (i4 sign-extended from its nibble).
inline int int4_at(DType t, const void* data, int64_t i) {
  const uint8_t byte = static_cast<const uint8_t*>(data)[i >> 1];
  const int nibble = (i & 1) ? byte >> 4 : byte & 0xf;
  return t == DType::i4 ? (nibble ^ 8) - 8 : nibble;
}
/// Sets element i of 4-bit data to v (its low four bits), leaving the other nibble of the byte.
inline void set_int4(void* data, int64_t i, int v) {
  uint8_t& byte = static_cast<uint8_t*>(data)[i >> 1];
  const uint8_t nibble = static_cast<uint8_t>(v & 0xf);
  byte = (i & 1) ? static_cast<uint8_t>((byte & 0x0f) | (nibble << 4)) : static_cast<uint8_t>((byte & 0xf0) | nibble);
}
/// "f32", "i64", "bool", …
std::string_view dtype_name(DType t);
/// Inverse of dtype_name.
std::optional<DType> dtype_from_name(std::string_view name);
/// Whether a raw 16-bit value read from a file is a known dtype.
bool dtype_valid(uint16_t raw);

inline bool is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}
inline bool is_signed_int(DType t) {
  return t == DType::i8 || t == DType::i16 || t == DType::i32 || t == DType::i64 || t == DType::i4;
}
inline bool is_unsigned_int(DType t) {
  return t == DType::u8 || t == DType::u16 || t == DType::u32 || t == DType::u64 || t == DType::u4;
}
inline bool is_integer(DType t) { return is_signed_int(t) || is_unsigned_int(t); }
/// u8 or i8: the types of quantized activations and weights.
inline bool is_int8(DType t) { return t == DType::u8 || t == DType::i8; }

template <class T> struct dtype_of;
#define KILN_DTYPE_OF(e, v, n, T) \
  template <> struct dtype_of<T> { static constexpr DType value = DType::e; };
KILN_DTYPES(KILN_DTYPE_OF)
#undef KILN_DTYPE_OF

/// Calls `f(T{})` with the C++ type of `t`; returns f's result. `t` must be defined and not
/// a 4-bit type.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
#define KILN_DTYPE_CASE(e, v, n, T) \
  case DType::e: return f(T{});
    KILN_DTYPES(KILN_DTYPE_CASE)
#undef KILN_DTYPE_CASE
    default: break;
  }
  return f(float{});  // unreachable for the types above; callers check dtype_valid and is_int4 first
}

}  // namespace kiln
