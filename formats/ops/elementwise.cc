// Core elementwise ops: schemas and type/shape inference. Unary math and activations keep
// the input's type and shape; binary and variadic ops broadcast with numpy rules; comparisons
// give bool. Small integer shape arithmetic (Shape → Gather → Mul → Concat chains) is computed
// here when every input's data is known, so export can resolve Reshape targets.
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "formats/op_schema.h"

namespace kiln {

namespace {

// ---- folding of small known inputs ------------------------------------------------------

bool is_compare(std::string_view op) {
  return op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual";
}

// Integer folding wraps like the kernels do (no signed overflow).
template <class V> V f_add(V a, V b) {
  if constexpr (std::is_integral_v<V>) return static_cast<V>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  else return a + b;
}
template <class V> V f_sub(V a, V b) {
  if constexpr (std::is_integral_v<V>) return static_cast<V>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
  else return a - b;
}
template <class V> V f_mul(V a, V b) {
  if constexpr (std::is_integral_v<V>) return static_cast<V>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  else return a * b;
}
template <class V> V f_neg(V a) { return f_sub(V(0), a); }

// One element of a folded op, computed in int64 or in double; nullopt for ops not folded.
template <class V>
std::optional<V> fold_scalar(std::string_view op, const std::vector<V>& v, const Node& n) {
  if (op == "Identity" || op == "Cast") return v[0];
  if (op == "Neg") return f_neg(v[0]);
  if (op == "Abs") return v[0] < 0 ? f_neg(v[0]) : v[0];
  if (op == "Not") return V(v[0] == 0);
  if (op == "Add" || op == "Sum") { V s = 0; for (V x : v) s = f_add(s, x); return s; }
  if (op == "Sub") return f_sub(v[0], v[1]);
  if (op == "Mul") return f_mul(v[0], v[1]);
  if (op == "Max") { V m = v[0]; for (V x : v) m = m < x ? x : m; return m; }
  if (op == "Min") { V m = v[0]; for (V x : v) m = x < m ? x : m; return m; }
  if (op == "Equal") return V(v[0] == v[1]);
  if (op == "Less") return V(v[0] < v[1]);
  if (op == "Greater") return V(v[0] > v[1]);
  if (op == "LessOrEqual") return V(v[0] <= v[1]);
  if (op == "GreaterOrEqual") return V(v[0] >= v[1]);
  if (op == "And") return V(v[0] != 0 && v[1] != 0);
  if (op == "Or") return V(v[0] != 0 || v[1] != 0);
  if (op == "Where") return v[0] != 0 ? v[1] : v[2];
  if constexpr (std::is_same_v<V, double>) {
    if (op == "Div") return v[0] / v[1];
    if (op == "Floor") return std::floor(v[0]);
    if (op == "Ceil") return std::ceil(v[0]);
    if (op == "Round") return std::nearbyint(v[0]);
    if (op == "Sqrt") return std::sqrt(v[0]);
  } else {
    // Divisors are checked for zero by the caller.
    if (op == "Div") return v[1] == -1 ? f_neg(v[0]) : v[0] / v[1];
    if (op == "Mod") {
      if (v[1] == -1) return 0;
      V r = v[0] % v[1];
      if (n.attr_int("fmod", 0) == 0 && r != 0 && ((r < 0) != (v[1] < 0))) r += v[1];
      return r;
    }
  }
  return std::nullopt;
}

void store(Tensor& t, int64_t i, double d, int64_t k, bool from_float) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      t.data<T>()[i] = from_float ? d != 0 : k != 0;
    } else if constexpr (std::is_integral_v<T>) {
      if (!from_float) { t.data<T>()[i] = static_cast<T>(k); return; }
      constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
      constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
      t.data<T>()[i] = std::isnan(d) ? T(0) : d <= lo ? std::numeric_limits<T>::lowest()
                       : d >= hi ? std::numeric_limits<T>::max() : static_cast<T>(d);
    } else {
      t.data<T>()[i] = static_cast<T>(static_cast<float>(from_float ? d : static_cast<double>(k)));
      if constexpr (std::is_same_v<T, double>) t.data<T>()[i] = from_float ? d : static_cast<double>(k);
    }
  });
}

// Computes output 0 when every input's data is known and the output is small. `domain_input`
// decides whether the arithmetic is integer or floating point.
Status maybe_fold(InferContext& ctx, size_t domain_input) {
  const InferOutput& o = ctx.outputs()[0];
  if (o.dtype == DType::undefined || !o.shape.is_concrete() || !ctx.all_inputs_known()) return {};
  std::vector<int64_t> out_shape = o.shape.concrete();
  int64_t numel = shape_numel(out_shape);
  if (numel < 0 || numel > kFoldLimit) return {};
  const std::string& op = ctx.node().op;
  // u64 values above INT64_MAX would compare wrongly in the int64 arithmetic below.
  for (size_t k = 0; k < ctx.num_inputs(); ++k)
    if (ctx.has_input(k) && ctx.dtype(k) == DType::u64) return {};
  const bool use_float = is_float(ctx.dtype(domain_input));
  if (!use_float && (op == "Div" || op == "Mod")) {
    const Tensor* d = ctx.value(1);
    for (int64_t i = 0; i < d->numel(); ++i)
      if (d->as_int64(i) == 0) return ctx.error("integer " + std::string(op == "Div" ? "division" : "modulo") + " by zero");
  }
  Tensor out(o.dtype, out_shape);
  const size_t rank = out_shape.size();
  std::vector<int64_t> idx(rank, 0);
  for (int64_t e = 0; e < numel; ++e) {
    // The flat index of each input for output index `idx`, with broadcasting.
    std::vector<double> fv;
    std::vector<int64_t> iv;
    for (size_t k = 0; k < ctx.num_inputs(); ++k) {
      if (!ctx.has_input(k)) continue;
      const Tensor& t = *ctx.value(k);
      int64_t flat = 0;
      const size_t pad = rank - static_cast<size_t>(t.rank());
      for (size_t d = pad; d < rank; ++d) {
        int64_t dim = t.dim(static_cast<int64_t>(d - pad));
        flat = flat * dim + (dim == 1 ? 0 : idx[d]);
      }
      if (use_float) fv.push_back(t.as_double(flat));
      else iv.push_back(t.as_int64(flat));
    }
    if (use_float) {
      auto r = fold_scalar<double>(op, fv, ctx.node());
      if (!r) return {};
      store(out, e, *r, 0, true);
    } else {
      auto r = fold_scalar<int64_t>(op, iv, ctx.node());
      if (!r) return {};
      store(out, e, 0, *r, false);
    }
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < out_shape[d]) break;
      idx[d] = 0;
    }
  }
  ctx.set_output_value(0, std::move(out));
  return {};
}

// ---- inference ----------------------------------------------------------------------------

Status infer_unary(InferContext& ctx) {
  const std::string& op = ctx.node().op;
  DType out = op == "IsNaN" || op == "IsInf" ? DType::boolean : ctx.dtype(0);
  if (op == "Gelu") {
    std::string a = ctx.node().attr_string("approximate", "none");
    if (a != "none" && a != "tanh") return ctx.error("approximate must be 'none' or 'tanh', got '" + a + "'");
  }
  ctx.set_output(0, out, ctx.shape(0));
  return maybe_fold(ctx, 0);
}

Status infer_binary(InferContext& ctx) {
  const std::string& op = ctx.node().op;
  if (op == "Mod" && is_float(ctx.dtype(0)) && ctx.node().attr_int("fmod", 0) == 0)
    return ctx.error("fmod must be 1 for floating-point inputs");
  if (op == "BitShift") {
    std::string d = ctx.node().attr_string("direction", "");
    if (d != "LEFT" && d != "RIGHT") return ctx.error("direction must be 'LEFT' or 'RIGHT', got '" + d + "'");
  }
  KILN_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(ctx.shape(0), ctx.shape(1), ctx));
  if (op == "PRelu" && s.rank_known && ctx.shape(0).rank_known && s.rank() != ctx.rank(0))
    return ctx.error("slope of shape " + ctx.shape(1).str() + " does not broadcast to the input's shape " +
                     ctx.shape(0).str());
  DType out = is_compare(op) ? DType::boolean : ctx.dtype(0);
  ctx.set_output(0, out, std::move(s));
  return maybe_fold(ctx, 0);
}

Status infer_variadic(InferContext& ctx) {
  Shape s = ctx.shape(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.error("input " + std::to_string(i) + " is missing");
    KILN_ASSIGN_OR_RETURN(s, broadcast_shapes(s, ctx.shape(i), ctx));
  }
  ctx.set_output(0, ctx.dtype(0), std::move(s));
  if (ctx.node().op == "Mean") return {};
  return maybe_fold(ctx, 0);
}

Status infer_where(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(ctx.shape(0), ctx.shape(1), ctx));
  KILN_ASSIGN_OR_RETURN(s, broadcast_shapes(s, ctx.shape(2), ctx));
  ctx.set_output(0, ctx.dtype(1), std::move(s));
  return maybe_fold(ctx, 1);
}

Status infer_clip(InferContext& ctx) {
  for (size_t i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    const char* what = i == 1 ? "min" : "max";
    const Shape& s = ctx.shape(i);
    if (s.is_concrete() && shape_numel(s.concrete()) != 1)
      return ctx.error(std::string(what) + " must have one element, got shape " + s.str());
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

Status infer_cast(InferContext& ctx) {
  std::string to = ctx.node().attr_string("to", "");
  std::optional<DType> t = dtype_from_name(to);
  if (!t) return ctx.error("attribute 'to' names unknown type '" + to + "'");
  ctx.set_output(0, *t, ctx.shape(0));
  return maybe_fold(ctx, 0);
}

constexpr AttrType kStr = AttrType::string;

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  using namespace types;
  auto unary = [&](std::string_view name, std::string_view summary, TypeSet t, std::vector<AttrSpec> attrs = {}) -> OpSchema& {
    OpSchema& s = r.add("", OpSchema{name, summary, 1, 1, 1, 1, std::move(attrs), infer_unary});
    s.traits.types = {input(0, t)};
    return s;
  };
  unary("Abs", "|x|", kNumeric);
  unary("Neg", "-x", kFloat | kSigned);
  unary("Exp", "e^x", kFloat);
  unary("Log", "natural logarithm", kFloat);
  unary("Sqrt", "square root", kFloat);
  unary("Reciprocal", "1 / x", kFloat);
  unary("Floor", "round down", kFloat);
  unary("Ceil", "round up", kFloat);
  unary("Round", "round to nearest, halves to even", kFloat);
  unary("Sign", "-1, 0 or 1", kNumeric);
  unary("Sin", "sine", kFloat);
  unary("Cos", "cosine", kFloat);
  unary("Tan", "tangent", kFloat);
  unary("Asin", "arcsine", kFloat);
  unary("Acos", "arccosine", kFloat);
  unary("Atan", "arctangent", kFloat);
  unary("Sinh", "hyperbolic sine", kFloat);
  unary("Cosh", "hyperbolic cosine", kFloat);
  unary("Asinh", "inverse hyperbolic sine", kFloat);
  unary("Acosh", "inverse hyperbolic cosine", kFloat);
  unary("Atanh", "inverse hyperbolic tangent", kFloat);
  unary("Erf", "error function", kFloat);
  unary("IsNaN", "x is NaN, as bool", kFloat);
  unary("IsInf", "x is an infinity of a detected sign, as bool", kFloat,
        {{"detect_negative", AttrType::int64, false, "report -inf (default 1)"},
         {"detect_positive", AttrType::int64, false, "report +inf (default 1)"}});
  unary("Not", "logical not of bool", kBool);
  unary("BitwiseNot", "bitwise complement of integers", kInt);
  unary("Identity", "y = x", kAny).traits.pass_through = OpTraits::PassThrough::all;
  unary("Relu", "max(x, 0)", kFloat | kSigned);
  unary("LeakyRelu", "x < 0 ? alpha * x : x", kFloat, {{"alpha", AttrType::float64, false, "slope for x < 0 (default 0.01)"}});
  unary("Elu", "x < 0 ? alpha * (e^x - 1) : x", kFloat, {{"alpha", AttrType::float64, false, "default 1"}});
  unary("Selu", "gamma * (x <= 0 ? alpha * (e^x - 1) : x)", kFloat,
        {{"alpha", AttrType::float64, false, "default 1.67326319"}, {"gamma", AttrType::float64, false, "default 1.05070102"}});
  unary("Celu", "max(0, x) + min(0, alpha * (e^(x / alpha) - 1))", kFloat, {{"alpha", AttrType::float64, false, "default 1"}});
  unary("Sigmoid", "1 / (1 + e^-x)", kFloat);
  unary("HardSigmoid", "max(0, min(1, alpha * x + beta))", kFloat,
        {{"alpha", AttrType::float64, false, "default 0.2"}, {"beta", AttrType::float64, false, "default 0.5"}});
  unary("HardSwish", "x * max(0, min(1, x / 6 + 0.5))", kFloat);
  unary("Tanh", "hyperbolic tangent", kFloat);
  unary("Softplus", "log(1 + e^x)", kFloat);
  unary("Softsign", "x / (1 + |x|)", kFloat);
  unary("Mish", "x * tanh(softplus(x))", kFloat);
  unary("Gelu", "x * Phi(x), exact or tanh approximation", kFloat,
        {{"approximate", kStr, false, "'none' (erf, default) or 'tanh'"}});
  unary("ThresholdedRelu", "x > alpha ? x : 0", kFloat, {{"alpha", AttrType::float64, false, "default 1"}});
  unary("Shrink", "x < -lambd ? x + bias : x > lambd ? x - bias : 0", kNumeric,
        {{"bias", AttrType::float64, false, "default 0"}, {"lambd", AttrType::float64, false, "default 0.5"}});
  unary("Swish", "x * sigmoid(alpha * x)", kFloat, {{"alpha", AttrType::float64, false, "default 1"}});

  auto binary = [&](std::string_view name, std::string_view summary, TypeSet t, std::vector<AttrSpec> attrs = {}) -> OpSchema& {
    OpSchema& s = r.add("", OpSchema{name, summary, 2, 2, 1, 1, std::move(attrs), infer_binary});
    s.traits.types = {input(0, t), same_as(1, 0)};
    return s;
  };
  binary("Add", "a + b (integers wrap)", kNumeric);
  binary("Sub", "a - b (integers wrap)", kNumeric);
  binary("Mul", "a * b (integers wrap)", kNumeric);
  binary("Div", "a / b; integers truncate toward zero, division by zero is an error", kNumeric);
  binary("Mod", "remainder; fmod=0 takes the divisor's sign, fmod=1 the dividend's", kNumeric,
         {{"fmod", AttrType::int64, false, "0 (integers only, default) or 1"}});
  // The exponent may have another numeric type than the base.
  binary("Pow", "a ^ b; b may have another numeric type, the result has a's", kFloat | DType::i32 | DType::i64)
      .traits.types[1] = input(1, kNumeric, "the exponent");
  binary("PRelu", "x < 0 ? slope * x : x, slope broadcast to x", kNumeric);
  binary("And", "logical and", kBool);
  binary("Or", "logical or", kBool);
  binary("Xor", "logical xor", kBool);
  binary("Equal", "a == b, as bool", kAny);
  binary("Less", "a < b, as bool", kNumeric);
  binary("Greater", "a > b, as bool", kNumeric);
  binary("LessOrEqual", "a <= b, as bool", kNumeric);
  binary("GreaterOrEqual", "a >= b, as bool", kNumeric);
  binary("BitShift", "a << b or a >> b on unsigned integers", kUnsigned,
         {{"direction", kStr, true, "'LEFT' or 'RIGHT'"}});
  binary("BitwiseAnd", "a & b", kInt);
  binary("BitwiseOr", "a | b", kInt);
  binary("BitwiseXor", "a ^ b", kInt);

  auto variadic = [&](std::string_view name, std::string_view summary, TypeSet t) {
    r.add("", OpSchema{name, summary, 1, kVariadic, 1, 1, {}, infer_variadic}).traits.types = {input(0, t), rest_same_as(1, 0)};
  };
  variadic("Max", "elementwise maximum of all inputs", kNumeric);
  variadic("Min", "elementwise minimum of all inputs", kNumeric);
  variadic("Sum", "elementwise sum of all inputs", kNumeric);
  variadic("Mean", "elementwise mean of all inputs", kFloat);

  r.add("", OpSchema{"Where", "condition ? x : y with broadcasting", 3, 3, 1, 1, {}, infer_where})
      .traits.types = {input(0, kBool, "condition"), input(1, kAny), same_as(2, 1)};
  r.add("", OpSchema{"Clip", "min(max(x, min), max); min/max are optional one-element inputs", 1, 3, 1, 1, {},
                     infer_clip}).traits.types = {input(0, kNumeric), same_as(1, 0, "min"), same_as(2, 0, "max")};
  r.add("", OpSchema{"Cast", "converts to another element type", 1, 1, 1, 1,
                     {{"to", kStr, true, "the kiln type name: f32, f16, bf16, f64, i8 … u64, bool"}}, infer_cast})
      .traits = {.types = {input(0, kAny)}, .pass_through = OpTraits::PassThrough::all};
}

}  // namespace kiln
