// Reference kernels of the unary elementwise ops: math functions and activations. Each op is
// a small functor over the compute type (float for f16/bf16) built from the node's attributes;
// one template runs it over any element type the op allows.
#include <cmath>
#include <string>
#include <type_traits>

#include "runtime/ref/activation.h"
#include "runtime/ref/elementwise_util.h"

namespace kiln::ref {

namespace {

// y[i] = op(C(x[i])), in X's element type, or (Bool) as a bool.
template <class Op, template <class> class Pred, bool Bool = false>
Status unary(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  const Op op(ctx.node());
  return dispatch<Pred>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    using Y = std::conditional_t<Bool, bool, T>;
    const T* px = x.data<T>();
    Y* py = y.data<Y>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) py[i] = static_cast<Y>(op(static_cast<C>(px[i])));
    return {};
  });
}

// A functor without attributes.
#define KILN_UNARY(Name, ...)                                   \
  struct Name {                                                 \
    explicit Name(const Node&) {}                               \
    template <class C> C operator()(C x) const { __VA_ARGS__ } \
  };

KILN_UNARY(Exp, return std::exp(x);)
KILN_UNARY(Log, return std::log(x);)
KILN_UNARY(Sqrt, return std::sqrt(x);)
KILN_UNARY(Reciprocal, return C(1) / x;)
KILN_UNARY(Floor, return std::floor(x);)
KILN_UNARY(Ceil, return std::ceil(x);)
// Halves round to even, as ONNX specifies (the default floating-point rounding mode).
KILN_UNARY(Round, return std::nearbyint(x);)
KILN_UNARY(Sin, return std::sin(x);)
KILN_UNARY(Cos, return std::cos(x);)
KILN_UNARY(Tan, return std::tan(x);)
KILN_UNARY(Asin, return std::asin(x);)
KILN_UNARY(Acos, return std::acos(x);)
KILN_UNARY(Atan, return std::atan(x);)
KILN_UNARY(Sinh, return std::sinh(x);)
KILN_UNARY(Cosh, return std::cosh(x);)
KILN_UNARY(Asinh, return std::asinh(x);)
KILN_UNARY(Acosh, return std::acosh(x);)
KILN_UNARY(Atanh, return std::atanh(x);)
KILN_UNARY(Erf, return std::erf(x);)
KILN_UNARY(Tanh, return act::tanh(x);)
// Both branches avoid overflowing exp for large |x|.
KILN_UNARY(Sigmoid, return act::sigmoid(x);)
KILN_UNARY(Softplus, if (x > C(0)) return x + std::log1p(std::exp(-x)); return std::log1p(std::exp(x));)
KILN_UNARY(Softsign, return x / (C(1) + std::abs(x));)
KILN_UNARY(Mish, const C sp = x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); return x * std::tanh(sp);)
KILN_UNARY(HardSwish, return act::hard_swish(x);)
// NaN stays NaN (x < 0 is false for it).
KILN_UNARY(Relu, return act::relu(x);)
KILN_UNARY(Sign, return x > C(0) ? C(1) : x < C(0) ? C(-1) : C(0);)
KILN_UNARY(Not, return !x;)
KILN_UNARY(BitwiseNot, return static_cast<C>(~x);)
KILN_UNARY(Abs, if constexpr (is_int_v<C>) return x < C(0) ? wrap_neg(x) : x; else return std::abs(x);)
KILN_UNARY(Neg, if constexpr (is_int_v<C>) return wrap_neg(x); else return -x;)
#undef KILN_UNARY

struct IsNaN {
  explicit IsNaN(const Node&) {}
  template <class C> bool operator()(C x) const { return std::isnan(x); }
};

struct IsInf {
  bool neg, pos;
  explicit IsInf(const Node& n)
      : neg(n.attr_int("detect_negative", 1) != 0), pos(n.attr_int("detect_positive", 1) != 0) {}
  template <class C> bool operator()(C x) const { return std::isinf(x) && (x > C(0) ? pos : neg); }
};

struct LeakyRelu {
  double alpha;
  explicit LeakyRelu(const Node& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <class C> C operator()(C x) const { return act::leaky_relu(x, C(alpha)); }
};

struct Elu {
  double alpha;
  explicit Elu(const Node& n) : alpha(n.attr_float("alpha", 1.0)) {}
  template <class C> C operator()(C x) const { return x < C(0) ? C(alpha) * std::expm1(x) : x; }
};

struct Selu {
  double alpha, gamma;
  explicit Selu(const Node& n)
      : alpha(n.attr_float("alpha", 1.67326319217681884765625f)), gamma(n.attr_float("gamma", 1.05070102214813232421875f)) {}
  template <class C> C operator()(C x) const {
    return x <= C(0) ? C(gamma) * (C(alpha) * std::exp(x) - C(alpha)) : C(gamma) * x;
  }
};

struct Celu {
  double alpha;
  explicit Celu(const Node& n) : alpha(n.attr_float("alpha", 1.0)) {}
  template <class C> C operator()(C x) const {
    const C a = C(alpha);
    return std::max(C(0), x) + std::min(C(0), a * std::expm1(x / a));
  }
};

struct HardSigmoid {
  double alpha, beta;
  explicit HardSigmoid(const Node& n) : alpha(n.attr_float("alpha", 0.2f)), beta(n.attr_float("beta", 0.5f)) {}
  template <class C> C operator()(C x) const { return act::hard_sigmoid(x, C(alpha), C(beta)); }
};

struct ThresholdedRelu {
  double alpha;
  explicit ThresholdedRelu(const Node& n) : alpha(n.attr_float("alpha", 1.0)) {}
  template <class C> C operator()(C x) const { return x > C(alpha) ? x : C(0); }
};

struct Swish {
  double alpha;
  explicit Swish(const Node& n) : alpha(n.attr_float("alpha", 1.0)) {}
  template <class C> C operator()(C x) const {
    const C z = C(alpha) * x;
    const C s = z >= C(0) ? C(1) / (C(1) + std::exp(-z)) : std::exp(z) / (C(1) + std::exp(z));
    return x * s;
  }
};

struct Gelu {
  bool tanh_approx;
  explicit Gelu(const Node& n) : tanh_approx(n.attr_string("approximate", "none") == "tanh") {}
  template <class C> C operator()(C x) const {
    return tanh_approx ? act::gelu_tanh(x) : act::gelu(x);
  }
};

// Shrink allows integer inputs with float bias/lambd: compute in double, convert back.
struct Shrink {
  double bias, lambd;
  explicit Shrink(const Node& n) : bias(n.attr_float("bias", 0.0)), lambd(n.attr_float("lambd", 0.5)) {}
  template <class C> C operator()(C x) const {
    const double v = static_cast<double>(x);
    const double r = v < -lambd ? v + bias : v > lambd ? v - bias : 0.0;
    return cast_value<C>(r);
  }
};

}  // namespace

void register_ref_elementwise_unary(KernelRegistry& r) {
  r.add_reference("Exp", unary<Exp, IsFloat>);
  r.add_reference("Log", unary<Log, IsFloat>);
  r.add_reference("Sqrt", unary<Sqrt, IsFloat>);
  r.add_reference("Reciprocal", unary<Reciprocal, IsFloat>);
  r.add_reference("Floor", unary<Floor, IsFloat>);
  r.add_reference("Ceil", unary<Ceil, IsFloat>);
  r.add_reference("Round", unary<Round, IsFloat>);
  r.add_reference("Sin", unary<Sin, IsFloat>);
  r.add_reference("Cos", unary<Cos, IsFloat>);
  r.add_reference("Tan", unary<Tan, IsFloat>);
  r.add_reference("Asin", unary<Asin, IsFloat>);
  r.add_reference("Acos", unary<Acos, IsFloat>);
  r.add_reference("Atan", unary<Atan, IsFloat>);
  r.add_reference("Sinh", unary<Sinh, IsFloat>);
  r.add_reference("Cosh", unary<Cosh, IsFloat>);
  r.add_reference("Asinh", unary<Asinh, IsFloat>);
  r.add_reference("Acosh", unary<Acosh, IsFloat>);
  r.add_reference("Atanh", unary<Atanh, IsFloat>);
  r.add_reference("Erf", unary<Erf, IsFloat>);
  r.add_reference("Tanh", unary<Tanh, IsFloat>);
  r.add_reference("Sigmoid", unary<Sigmoid, IsFloat>);
  r.add_reference("Softplus", unary<Softplus, IsFloat>);
  r.add_reference("Softsign", unary<Softsign, IsFloat>);
  r.add_reference("Mish", unary<Mish, IsFloat>);
  r.add_reference("HardSwish", unary<HardSwish, IsFloat>);
  r.add_reference("Relu", unary<Relu, IsNumeric>);
  r.add_reference("Sign", unary<Sign, IsNumeric>);
  r.add_reference("Abs", unary<Abs, IsNumeric>);
  r.add_reference("Neg", unary<Neg, IsNumeric>);
  r.add_reference("Not", unary<Not, IsBool>);
  r.add_reference("BitwiseNot", unary<BitwiseNot, IsInt>);
  r.add_reference("IsNaN", unary<IsNaN, IsFloat, true>);
  r.add_reference("IsInf", unary<IsInf, IsFloat, true>);
  r.add_reference("LeakyRelu", unary<LeakyRelu, IsFloat>);
  r.add_reference("Elu", unary<Elu, IsFloat>);
  r.add_reference("Selu", unary<Selu, IsFloat>);
  r.add_reference("Celu", unary<Celu, IsFloat>);
  r.add_reference("HardSigmoid", unary<HardSigmoid, IsFloat>);
  r.add_reference("ThresholdedRelu", unary<ThresholdedRelu, IsFloat>);
  r.add_reference("Swish", unary<Swish, IsFloat>);
  r.add_reference("Gelu", unary<Gelu, IsFloat>);
  r.add_reference("Shrink", unary<Shrink, IsNumeric>);
}

}  // namespace kiln::ref
