// Element-type helpers shared by the elementwise and reduce reference kernels: the type a
// kernel computes in (f16/bf16 go through float), ONNX Cast conversion without C++ undefined
// behaviour, and wrapping integer arithmetic (ONNX integers wrap; C++ signed overflow is UB).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "formats/dtype.h"
#include "runtime/kernel.h"

namespace kiln::ref {

template <class T> struct compute_type { using type = T; };
template <> struct compute_type<half> { using type = float; };
template <> struct compute_type<bfloat16> { using type = float; };
/// The type arithmetic on T happens in: float for f16/bf16, T otherwise.
template <class T> using compute_t = typename compute_type<T>::type;

template <class T>
inline constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;
template <class T>
inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <class T>
inline constexpr bool is_numeric_v = is_float_v<T> || is_int_v<T>;

/// Converts like ONNX Cast: to bool is `!= 0`, float to integer truncates toward zero. Values
/// outside the target range (and NaN) have no defined ONNX result; they saturate (NaN → 0)
/// instead of invoking C++ undefined behaviour.
template <class To, class From>
inline To cast_value(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != 0;
  } else if constexpr (std::is_same_v<From, bool>) {
    return To(v ? 1.0f : 0.0f);
  } else if constexpr (is_int_v<To> && is_float_v<From>) {
    const double d = static_cast<double>(static_cast<compute_t<From>>(v));
    if (std::isnan(d)) return To(0);
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::lowest());
    constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
    if (d <= lo) return std::numeric_limits<To>::lowest();
    if (d >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else if constexpr (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>) {
    return To(static_cast<float>(static_cast<compute_t<From>>(v)));
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(v));
  }
}

/// Integer arithmetic modulo 2^bits, as ONNX Runtime produces it, without signed overflow.
template <class T> inline T wrap_add(T a, T b) { return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
template <class T> inline T wrap_sub(T a, T b) { return static_cast<T>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
template <class T> inline T wrap_mul(T a, T b) { return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }
template <class T> inline T wrap_neg(T a) { return static_cast<T>(uint64_t{0} - static_cast<uint64_t>(a)); }

/// Runs `f(T{})` for the element type of `t` when `Pred<T>` holds, else a user error naming
/// the op and dtype (inference rejects those first; this keeps kernels safe on bad graphs).
template <template <class> class Pred, class F>
Status dispatch(KernelContext& ctx, DType t, F&& f) {
  return visit_dtype(t, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (Pred<T>::value) return f(tag);
    else return ctx.error(ctx.node().op + " does not support " + std::string(dtype_name(t)));
  });
}

template <class T> struct IsFloat : std::bool_constant<is_float_v<T>> {};
template <class T> struct IsInt : std::bool_constant<is_int_v<T>> {};
template <class T> struct IsNumeric : std::bool_constant<is_numeric_v<T>> {};
template <class T> struct IsBool : std::bool_constant<std::is_same_v<T, bool>> {};
template <class T> struct IsAny : std::true_type {};
template <class T> struct IsNumericOrBool : std::bool_constant<is_numeric_v<T> || std::is_same_v<T, bool>> {};

// Reference kernels of the elementwise family live in several files; the registration
// function in runtime/ref/elementwise.cc calls these.
void register_ref_elementwise_unary(KernelRegistry& r);
void register_ref_elementwise_binary(KernelRegistry& r);
// The reduce family's split the same way (runtime/ref/reduce*.cc).
void register_ref_reduce_norm(KernelRegistry& r);

}  // namespace kiln::ref
