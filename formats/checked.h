// Overflow-checked size arithmetic. Dims, pads, strides and byte counts come from files that
// may be hostile, so every product or sum of sizes goes through CheckedInt: it carries an
// overflow flag instead of wrapping (which is undefined behaviour for int64 and would quote
// wrapped-around numbers in messages), and the caller reports the overflow once at the end.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace kiln {

/// An int64 that remembers whether any operation producing it overflowed.
class CheckedInt {
 public:
  constexpr CheckedInt(int64_t v = 0) : v_(v) {}  // NOLINT: implicit, like the int it wraps

  /// False once any operation overflowed.
  constexpr bool ok() const { return !overflow_; }
  /// The value; only meaningful when ok().
  constexpr int64_t value() const { return v_; }
  constexpr std::optional<int64_t> get() const { return overflow_ ? std::nullopt : std::optional<int64_t>(v_); }

  friend constexpr CheckedInt operator+(CheckedInt a, CheckedInt b) {
    CheckedInt r;
    r.overflow_ = a.overflow_ || b.overflow_ || __builtin_add_overflow(a.v_, b.v_, &r.v_);
    return r;
  }
  friend constexpr CheckedInt operator-(CheckedInt a, CheckedInt b) {
    CheckedInt r;
    r.overflow_ = a.overflow_ || b.overflow_ || __builtin_sub_overflow(a.v_, b.v_, &r.v_);
    return r;
  }
  friend constexpr CheckedInt operator*(CheckedInt a, CheckedInt b) {
    CheckedInt r;
    r.overflow_ = a.overflow_ || b.overflow_ || __builtin_mul_overflow(a.v_, b.v_, &r.v_);
    return r;
  }
  /// Division by zero counts as overflow; INT64_MIN / -1 too.
  friend constexpr CheckedInt operator/(CheckedInt a, CheckedInt b) {
    CheckedInt r;
    r.overflow_ = a.overflow_ || b.overflow_ || b.v_ == 0 || (a.v_ == INT64_MIN && b.v_ == -1);
    r.v_ = r.overflow_ ? 0 : a.v_ / b.v_;
    return r;
  }
  /// Equal when neither overflowed and the values match.
  friend constexpr bool operator==(CheckedInt a, CheckedInt b) { return a.ok() && b.ok() && a.v_ == b.v_; }

  CheckedInt& operator+=(CheckedInt o) { return *this = *this + o; }
  CheckedInt& operator-=(CheckedInt o) { return *this = *this - o; }
  CheckedInt& operator*=(CheckedInt o) { return *this = *this * o; }

 private:
  int64_t v_ = 0;
  bool overflow_ = false;
};

/// a * b, a + b, a - b; nullopt on overflow.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) { return (CheckedInt(a) * b).get(); }
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) { return (CheckedInt(a) + b).get(); }
inline std::optional<int64_t> checked_sub(int64_t a, int64_t b) { return (CheckedInt(a) - b).get(); }

/// x truncated toward zero, or nullopt for NaN, infinities and values outside int64 (a plain
/// conversion of those is undefined behaviour).
inline std::optional<int64_t> float_to_int64(double x) {
  if (!(x >= -0x1p63 && x < 0x1p63)) return std::nullopt;
  return static_cast<int64_t>(x);
}

/// x truncated toward zero and clamped to int64; NaN gives 0. For kernels whose results are
/// defined whatever the input (a coordinate far outside reads padding either way).
inline int64_t saturate_to_int64(double x) {
  if (x != x) return 0;
  if (x >= 0x1p63) return INT64_MAX;
  if (x < -0x1p63) return INT64_MIN;
  return static_cast<int64_t>(x);
}

/// The i-th element of an integer Range, start + i * delta, computed modulo 2^64: exact
/// whenever the element itself fits (it lies between start and limit), even where i * delta
/// alone would overflow.
inline int64_t range_element(int64_t start, int64_t delta, int64_t i) {
  return static_cast<int64_t>(static_cast<uint64_t>(start) + static_cast<uint64_t>(i) * static_cast<uint64_t>(delta));
}

/// How many elements an integer Range from start by delta (non-zero) has below (above, for a
/// negative delta) limit: max(0, ceil((limit - start) / delta)), exact for all int64 values.
inline uint64_t range_count(int64_t start, int64_t limit, int64_t delta) {
  if (delta > 0 ? limit <= start : limit >= start) return 0;
  // Differences and magnitudes in uint64 are exact: both lie below 2^64.
  const uint64_t span = delta > 0 ? static_cast<uint64_t>(limit) - static_cast<uint64_t>(start)
                                  : static_cast<uint64_t>(start) - static_cast<uint64_t>(limit);
  const uint64_t step = delta > 0 ? static_cast<uint64_t>(delta) : uint64_t{0} - static_cast<uint64_t>(delta);
  return span / step + (span % step != 0);
}

/// Product of sizes; nullopt on overflow.
inline std::optional<int64_t> checked_product(std::span<const int64_t> v) {
  CheckedInt p = 1;
  for (int64_t x : v) p *= x;
  return p.get();
}

}  // namespace kiln
