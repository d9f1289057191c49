// Reference kernels of the binary and variadic elementwise ops: arithmetic, comparisons,
// logic, bit operations, PRelu, and Max/Min/Sum/Mean over any number of inputs. All of them
// broadcast with numpy rules through runtime/ref/broadcast.h.
#include <cmath>
#include <string>

#include "runtime/ref/broadcast.h"
#include "runtime/ref/elementwise_util.h"

namespace kiln::ref {

namespace {

// out = op(a, b) with a and b of the same type T and out of type T or bool.
template <class Op, template <class> class Pred, bool kBoolOut = false>
Status binary(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Tensor& y = ctx.output(0);
  const Op op(ctx.node());
  return dispatch<Pred>(ctx, a.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    using O = std::conditional_t<kBoolOut, bool, T>;
    if (y.numel() > 0) KILN_RETURN_IF_ERROR(op.template check<T>(ctx, b));
    broadcast_binary(a.data<T>(), a.shape(), b.data<T>(), b.shape(), y.data<O>(), y.shape(),
                     [&](T va, T vb) { return static_cast<O>(op(static_cast<C>(va), static_cast<C>(vb))); });
    return {};
  });
}

// Base for ops that need no check of their second operand.
struct NoCheck {
  template <class T> Status check(KernelContext&, const Tensor&) const { return {}; }
};

#define KILN_BINARY(Name, ...)                                         \
  struct Name : NoCheck {                                              \
    explicit Name(const Node&) {}                                      \
    template <class C> auto operator()(C a, C b) const { __VA_ARGS__ } \
  };

KILN_BINARY(Add, if constexpr (is_int_v<C>) return wrap_add(a, b); else return a + b;)
KILN_BINARY(Sub, if constexpr (is_int_v<C>) return wrap_sub(a, b); else return a - b;)
KILN_BINARY(Mul, if constexpr (is_int_v<C>) return wrap_mul(a, b); else return a * b;)
KILN_BINARY(Equal, return a == b;)
KILN_BINARY(Less, return a < b;)
KILN_BINARY(Greater, return a > b;)
KILN_BINARY(LessOrEqual, return a <= b;)
KILN_BINARY(GreaterOrEqual, return a >= b;)
KILN_BINARY(And, return a && b;)
KILN_BINARY(Or, return a || b;)
KILN_BINARY(Xor, return a != b;)
KILN_BINARY(BitwiseAnd, return static_cast<C>(a & b);)
KILN_BINARY(BitwiseOr, return static_cast<C>(a | b);)
KILN_BINARY(BitwiseXor, return static_cast<C>(a ^ b);)
KILN_BINARY(Max, return a < b ? b : a;)
KILN_BINARY(Min, return b < a ? b : a;)
KILN_BINARY(PRelu, if constexpr (is_int_v<C>) return a < C(0) ? wrap_mul(a, b) : a; else return a < C(0) ? a * b : a;)
#undef KILN_BINARY

// Integer division and modulo by zero are user errors, found before any output is written.
struct IntDivisorCheck {
  template <class T>
  Status check(KernelContext& ctx, const Tensor& b) const {
    if constexpr (is_int_v<T>) {
      const T* p = b.data<T>();
      for (int64_t i = 0, n = b.numel(); i < n; ++i)
        if (p[i] == T(0)) return ctx.error("integer " + std::string(ctx.node().op == "Div" ? "division" : "modulo") + " by zero");
    }
    return {};
  }
};

// Integer division truncates toward zero (like C++ and ONNX Runtime); x / -1 wraps instead
// of overflowing for the most negative value.
struct Div : IntDivisorCheck {
  explicit Div(const Node&) {}
  template <class C> C operator()(C a, C b) const {
    if constexpr (is_int_v<C> && std::is_signed_v<C>) {
      if (b == C(-1)) return wrap_neg(a);
      return static_cast<C>(a / b);
    } else {
      return static_cast<C>(a / b);
    }
  }
};

// fmod=0: the result takes the divisor's sign (Python %); fmod=1: the dividend's (C fmod).
struct Mod : IntDivisorCheck {
  bool fmod;
  explicit Mod(const Node& n) : fmod(n.attr_int("fmod", 0) != 0) {}
  template <class C> C operator()(C a, C b) const {
    if constexpr (is_float_v<C>) {
      C r = std::fmod(a, b);
      if (!fmod && r != C(0) && ((r < C(0)) != (b < C(0)))) r += b;
      return r;
    } else if constexpr (std::is_signed_v<C>) {
      if (b == C(-1)) return C(0);
      C r = static_cast<C>(a % b);
      if (!fmod && r != C(0) && ((r < C(0)) != (b < C(0)))) r = static_cast<C>(r + b);
      return r;
    } else {
      return static_cast<C>(a % b);
    }
  }
};

// Shifts by the type's width or more give 0 rather than C++ undefined behaviour.
struct BitShift : NoCheck {
  bool left;
  explicit BitShift(const Node& n) : left(n.attr_string("direction", "") == "LEFT") {}
  template <class C> C operator()(C a, C b) const {
    if (static_cast<uint64_t>(b) >= sizeof(C) * 8) return C(0);
    return left ? static_cast<C>(a << b) : static_cast<C>(a >> b);
  }
};

// Integer powers with a non-negative exponent are exact (wrapping); otherwise the result is
// computed in double and converted like Cast.
template <class B, class E>
B pow_value(B base, E ex) {
  if constexpr (is_int_v<B> && is_int_v<E>) {
    if (ex < E(0)) return base == B(1) ? B(1) : base == B(-1) ? ((static_cast<int64_t>(ex) & 1) ? B(-1) : B(1)) : B(0);
    B r = 1, p = base;
    for (uint64_t e = static_cast<uint64_t>(ex); e; e >>= 1) {
      if (e & 1) r = wrap_mul(r, p);
      p = wrap_mul(p, p);
    }
    return r;
  } else {
    using CB = compute_t<B>;
    const double v = std::pow(static_cast<double>(static_cast<CB>(base)), static_cast<double>(static_cast<compute_t<E>>(ex)));
    if constexpr (std::is_same_v<CB, float>) return static_cast<B>(static_cast<float>(v));
    else return cast_value<B>(v);
  }
}

template <class T> struct IsPowBase : std::bool_constant<is_float_v<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>> {};

// Pow's exponent may have another type than its base; the result has the base's type.
Status ref_pow(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Tensor& y = ctx.output(0);
  return dispatch<IsPowBase>(ctx, a.dtype(), [&](auto btag) -> Status {
    using B = decltype(btag);
    return dispatch<IsNumeric>(ctx, b.dtype(), [&](auto etag) -> Status {
      using E = decltype(etag);
      broadcast_binary(a.data<B>(), a.shape(), b.data<E>(), b.shape(), y.data<B>(), y.shape(),
                       [](B va, E vb) { return pow_value(va, vb); });
      return {};
    });
  });
}

// Max, Min, Sum, Mean: the first input broadcast into the output, then each other input
// combined into it in place.
template <class Op, template <class> class Pred, bool kMean = false>
Status variadic(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  const Op op(ctx.node());
  return dispatch<Pred>(ctx, ctx.input(0).dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* py = y.data<T>();
    const Tensor& first = ctx.input(0);
    broadcast_unary(first.data<T>(), first.shape(), py, y.shape(), [](T v) { return v; });
    for (size_t k = 1; k < ctx.num_inputs(); ++k) {
      const Tensor& in = ctx.input(k);
      broadcast_binary(py, y.shape(), in.data<T>(), in.shape(), py, y.shape(),
                       [&](T va, T vb) { return static_cast<T>(op(static_cast<C>(va), static_cast<C>(vb))); });
    }
    if constexpr (kMean) {
      const C n = static_cast<C>(ctx.num_inputs());
      for (int64_t i = 0; i < y.numel(); ++i) py[i] = static_cast<T>(static_cast<C>(py[i]) / n);
    }
    return {};
  });
}

}  // namespace

void register_ref_elementwise_binary(KernelRegistry& r) {
  r.add_reference("Add", binary<Add, IsNumeric>);
  r.add_reference("Sub", binary<Sub, IsNumeric>);
  r.add_reference("Mul", binary<Mul, IsNumeric>);
  r.add_reference("Div", binary<Div, IsNumeric>);
  r.add_reference("Mod", binary<Mod, IsNumeric>);
  r.add_reference("Pow", ref_pow);
  r.add_reference("PRelu", binary<PRelu, IsNumeric>);
  r.add_reference("Equal", binary<Equal, IsNumericOrBool, true>);
  r.add_reference("Less", binary<Less, IsNumeric, true>);
  r.add_reference("Greater", binary<Greater, IsNumeric, true>);
  r.add_reference("LessOrEqual", binary<LessOrEqual, IsNumeric, true>);
  r.add_reference("GreaterOrEqual", binary<GreaterOrEqual, IsNumeric, true>);
  r.add_reference("And", binary<And, IsBool>);
  r.add_reference("Or", binary<Or, IsBool>);
  r.add_reference("Xor", binary<Xor, IsBool>);
  r.add_reference("BitwiseAnd", binary<BitwiseAnd, IsInt>);
  r.add_reference("BitwiseOr", binary<BitwiseOr, IsInt>);
  r.add_reference("BitwiseXor", binary<BitwiseXor, IsInt>);
  r.add_reference("BitShift", binary<BitShift, IsInt>);
  r.add_reference("Max", variadic<Max, IsNumeric>);
  r.add_reference("Min", variadic<Min, IsNumeric>);
  r.add_reference("Sum", variadic<Add, IsNumeric>);
  r.add_reference("Mean", variadic<Add, IsFloat, true>);
}

}  // namespace kiln::ref
