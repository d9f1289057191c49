// Core ops of the reduce family: schemas and type/shape inference for reductions over axes
// (axes always an input), ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax (one axis, opset-13
// semantics), CumSum/CumProd, TopK, and the normalizations (Layer, Batch (inference),
// Instance, Group, Lp, RMS).
#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "formats/op_schema.h"

namespace kiln {

namespace {

// Known dims of a shape, or nullopt when one is not known.
std::optional<int64_t> known_dim(const Shape& s, int64_t axis) {
  if (!s.rank_known || axis < 0 || axis >= s.rank() || !s.dims[static_cast<size_t>(axis)].is_known()) return std::nullopt;
  return s.dims[static_cast<size_t>(axis)].value;
}

// Shape arithmetic such as ReduceProd(Shape(x)): computes small i64/i32 sums, products,
// maxima and minima when the data is known, so export can resolve shapes built from them.
Status fold_reduce(InferContext& ctx, const std::vector<bool>& reduced) {
  const std::string& op = ctx.node().op;
  const DType t = ctx.dtype(0);
  if ((t != DType::i64 && t != DType::i32) || !ctx.all_inputs_known()) return {};
  if (op != "ReduceSum" && op != "ReduceProd" && op != "ReduceMax" && op != "ReduceMin") return {};
  const Tensor& x = *ctx.value(0);
  const Shape& os = ctx.outputs()[0].shape;
  if (x.numel() > kFoldLimit || !os.is_concrete()) return {};
  Tensor out(t, os.concrete());
  std::vector<int64_t> acc(static_cast<size_t>(out.numel()), op == "ReduceProd" ? 1 : 0);
  std::vector<bool> seen(acc.size(), false);
  std::vector<int64_t> idx(x.shape().size(), 0);
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      if (!reduced[d]) o = o * x.dim(static_cast<int64_t>(d)) + idx[d];
    const int64_t v = x.as_int64(e);
    int64_t& a = acc[static_cast<size_t>(o)];
    const uint64_t ua = static_cast<uint64_t>(a), uv = static_cast<uint64_t>(v);
    if (op == "ReduceSum") a = static_cast<int64_t>(ua + uv);
    else if (op == "ReduceProd") a = static_cast<int64_t>(ua * uv);
    else if (!seen[static_cast<size_t>(o)] || (op == "ReduceMax" ? v > a : v < a)) a = v;
    seen[static_cast<size_t>(o)] = true;
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < x.dim(static_cast<int64_t>(d))) break;
      idx[d] = 0;
    }
  }
  for (size_t o = 0; o < acc.size(); ++o) {
    // Max/min of an empty set (the type's extremes) are left to the kernel.
    int64_t v = acc[o];
    if (!seen[o] && (op == "ReduceMax" || op == "ReduceMin")) return {};
    if (t == DType::i64) out.data<int64_t>()[o] = v;
    else out.data<int32_t>()[o] = static_cast<int32_t>(v);
  }
  ctx.set_output_value(0, std::move(out));
  return {};
}

// ReduceSum, ReduceMean, …: data, optional i64 axes; keepdims, noop_with_empty_axes.
Status infer_reduce(InferContext& ctx) {
  const bool keepdims = ctx.node().attr_int("keepdims", 1) != 0;
  const bool noop = ctx.node().attr_int("noop_with_empty_axes", 0) != 0;
  const Shape& in = ctx.shape(0);
  std::optional<std::vector<int64_t>> axes;
  if (!ctx.has_input(1)) {
    axes.emplace();
  } else {
    if (ctx.rank(1) > 1) return ctx.error("axes must be 1-D, got shape " + ctx.shape(1).str());
    if (const Tensor* v = ctx.value(1)) axes = v->to_int64_vector();
  }
  if (axes && axes->empty() && noop) {
    ctx.set_output(0, ctx.dtype(0), in);
    return {};
  }
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  const int64_t rank = in.rank();
  if (!axes) {
    // Which axes is known only at run time: the rank is known when dims are kept, or when
    // the number of axes is.
    if (keepdims) {
      ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(static_cast<size_t>(rank), Dim::unknown())));
    } else if (auto n = known_dim(ctx.shape(1), 0); n && *n <= rank) {
      ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(static_cast<size_t>(rank - *n), Dim::unknown())));
    } else {
      ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    }
    return {};
  }
  std::vector<bool> reduced(static_cast<size_t>(rank), axes->empty());
  for (int64_t a : *axes) {
    KILN_ASSIGN_OR_RETURN(int64_t n, normalize_axis(a, rank, ctx, "axis"));
    if (reduced[static_cast<size_t>(n)] && !axes->empty())
      return ctx.error("axis " + std::to_string(a) + " is given twice");
    reduced[static_cast<size_t>(n)] = true;
  }
  std::vector<Dim> out;
  for (int64_t i = 0; i < rank; ++i) {
    if (!reduced[static_cast<size_t>(i)]) out.push_back(in.dims[static_cast<size_t>(i)]);
    else if (keepdims) out.push_back(Dim::known(1));
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return fold_reduce(ctx, reduced);
}

Status infer_arg(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, DType::i64, Shape::unknown_rank());
    return {};
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), in.rank(), ctx));
  if (auto d = known_dim(in, axis); d && *d == 0) return ctx.error("cannot take " + ctx.node().op + " over an empty axis");
  std::vector<Dim> out = in.dims;
  if (ctx.node().attr_int("keepdims", 1) != 0) out[static_cast<size_t>(axis)] = Dim::known(1);
  else out.erase(out.begin() + axis);
  ctx.set_output(0, DType::i64, Shape(std::move(out)));
  return {};
}

// Softmax, LogSoftmax, Hardmax and LpNormalization: along one axis, same shape.
Status infer_axis_float(InferContext& ctx) {
  if (ctx.rank(0) >= 0) KILN_RETURN_IF_ERROR(normalize_axis(ctx.node().attr_int("axis", -1), ctx.rank(0), ctx).status());
  if (ctx.node().op == "LpNormalization") {
    int64_t p = ctx.node().attr_int("p", 2);
    if (p != 1 && p != 2) return ctx.error("p must be 1 or 2, got " + std::to_string(p));
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

Status infer_cumsum(InferContext& ctx) {
  if (const Tensor* a = ctx.value(1); a && ctx.rank(0) >= 0) {
    if (a->numel() != 1) return ctx.error("axis must have one element, got shape " + shape_str(a->shape()));
    KILN_RETURN_IF_ERROR(normalize_axis(a->as_int64(0), ctx.rank(0), ctx).status());
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

Result<DType> stash_dtype(const InferContext& ctx) {
  // ONNX TensorProto codes: the type statistics are kept in.
  switch (ctx.node().attr_int("stash_type", 1)) {
    case 1: return DType::f32;
    case 10: return DType::f16;
    case 11: return DType::f64;
    case 16: return DType::bf16;
    default: return ctx.error("stash_type " + std::to_string(ctx.node().attr_int("stash_type", 1)) + " is not supported");
  }
}

// Scale/bias of Layer- and RMSNormalization broadcast to the normalized dims X.shape[axis:].
Status check_norm_param(const InferContext& ctx, size_t i, int64_t axis, const char* what) {
  if (!ctx.has_input(i)) return {};
  const Shape& x = ctx.shape(0);
  const Shape& p = ctx.shape(i);
  if (!x.rank_known || !p.rank_known) return {};
  const int64_t norm_rank = x.rank() - axis;
  if (p.rank() > norm_rank)
    return ctx.error(std::string(what) + " of shape " + p.str() + " does not broadcast to the normalized dims of " + x.str());
  for (int64_t k = 0; k < p.rank(); ++k) {
    const Dim& pd = p.dims[static_cast<size_t>(k)];
    const Dim& xd = x.dims[static_cast<size_t>(x.rank() - p.rank() + k)];
    if (pd.is_known() && xd.is_known() && pd.value != 1 && pd.value != xd.value)
      return ctx.error(std::string(what) + " of shape " + p.str() + " does not broadcast to the normalized dims of " + x.str());
  }
  return {};
}

Status infer_layer_norm(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DType stash, stash_dtype(ctx));
  const Shape& x = ctx.shape(0);
  ctx.set_output(0, ctx.dtype(0), x);
  if (!x.rank_known) {
    ctx.set_output(1, stash, Shape::unknown_rank());
    ctx.set_output(2, stash, Shape::unknown_rank());
    return {};
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", -1), x.rank(), ctx));
  KILN_RETURN_IF_ERROR(check_norm_param(ctx, 1, axis, "scale"));
  if (ctx.node().op == "LayerNormalization") KILN_RETURN_IF_ERROR(check_norm_param(ctx, 2, axis, "bias"));
  std::vector<Dim> stat(x.dims.begin(), x.dims.begin() + axis);
  stat.resize(x.dims.size(), Dim::known(1));
  ctx.set_output(1, stash, Shape(stat));
  ctx.set_output(2, stash, Shape(stat));
  return {};
}

// QLayerNormalization (lower_int8 makes it): LayerNormalization of DQ(x) quantized as Q does;
// inputs x, x_scale, x_zero_point, scale, y_scale, y_zero_point, B (optional); y takes
// y_zero_point's type.
Status infer_qlayer_norm(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalar_inputs(ctx, {1, 2, 4, 5}));
  KILN_ASSIGN_OR_RETURN(DType stash, stash_dtype(ctx));
  if (stash != DType::f32) return ctx.error("stash_type must be 1 (f32)");
  const Shape& x = ctx.shape(0);
  ctx.set_output(0, ctx.dtype(5), x);
  if (!x.rank_known) return {};
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", -1), x.rank(), ctx));
  KILN_RETURN_IF_ERROR(check_norm_param(ctx, 3, axis, "scale"));
  return check_norm_param(ctx, 6, axis, "bias");
}

// Per-channel parameter inputs [C] of Batch-, Instance- and GroupNormalization.
Status check_channel_params(const InferContext& ctx, size_t first, size_t last) {
  const Shape& x = ctx.shape(0);
  if (x.rank_known && x.rank() < 2) return ctx.error("X must have rank 2 or more, got shape " + x.str());
  std::optional<int64_t> c = known_dim(x, 1);
  static const char* names[] = {"X", "scale", "B", "mean", "var"};
  for (size_t i = first; i <= last; ++i) {
    const Shape& p = ctx.shape(i);
    if (p.rank_known && p.rank() != 1) return ctx.error(std::string(names[i]) + " must be 1-D, got shape " + p.str());
    if (auto n = known_dim(p, 0); n && c && *n != *c)
      return ctx.error(std::string(names[i]) + " has " + std::to_string(*n) + " elements but X has " +
                       std::to_string(*c) + " channels");
  }
  return {};
}

Status infer_channel_norm(InferContext& ctx) {
  const std::string& op = ctx.node().op;
  KILN_RETURN_IF_ERROR(check_channel_params(ctx, 1, op == "BatchNormalization" ? 4 : 2));
  if (op == "GroupNormalization") {
    int64_t g = ctx.node().attr_int("num_groups", 0);
    if (g <= 0) return ctx.error("num_groups must be positive, got " + std::to_string(g));
    if (auto c = known_dim(ctx.shape(0), 1); c && *c % g != 0)
      return ctx.error(std::to_string(*c) + " channels do not divide into " + std::to_string(g) + " groups");
    KILN_RETURN_IF_ERROR(stash_dtype(ctx).status());
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

Status infer_topk(InferContext& ctx) {
  const Shape& x = ctx.shape(0);
  if (!x.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    ctx.set_output(1, DType::i64, Shape::unknown_rank());
    return {};
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", -1), x.rank(), ctx));
  std::vector<Dim> out = x.dims;
  out[static_cast<size_t>(axis)] = Dim::unknown();
  if (const Tensor* k = ctx.value(1)) {
    if (k->numel() != 1) return ctx.error("K must have one element, got shape " + shape_str(k->shape()));
    int64_t kv = k->as_int64(0);
    if (kv < 0) return ctx.error("K must not be negative, got " + std::to_string(kv));
    if (auto d = known_dim(x, axis); d && kv > *d)
      return ctx.error("K " + std::to_string(kv) + " is larger than the axis size " + std::to_string(*d));
    out[static_cast<size_t>(axis)] = Dim::known(kv);
  }
  ctx.set_output(0, ctx.dtype(0), Shape(out));
  ctx.set_output(1, DType::i64, Shape(out));
  return {};
}

}  // namespace

void register_reduce_ops(OpRegistry& r) {
  using namespace types;
  const std::vector<AttrSpec> reduce_attrs = {
      {"keepdims", AttrType::int64, false, "keep reduced dims as size 1 (default 1)"},
      {"noop_with_empty_axes", AttrType::int64, false, "with empty axes: 1 = identity, 0 = reduce all (default 0)"}};
  for (std::string_view name : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
    r.add("", OpSchema{name, "reduces data over the i64 axes input (all axes when omitted)", 1, 2, 1, 1,
                       reduce_attrs, infer_reduce})
        .traits.types = {input(0, name == "ReduceMax" || name == "ReduceMin" ? kNumeric | kBool : kNumeric),
                         input(1, DType::i64, "axes")};
  const std::vector<AttrSpec> arg_attrs = {{"axis", AttrType::int64, false, "default 0"},
                                           {"keepdims", AttrType::int64, false, "default 1"},
                                           {"select_last_index", AttrType::int64, false, "ties: 1 = last index (default 0)"}};
  r.add("", OpSchema{"ArgMax", "index of the largest element along axis, as i64", 1, 1, 1, 1, arg_attrs, infer_arg})
      .traits.types = {input(0, kNumeric)};
  r.add("", OpSchema{"ArgMin", "index of the smallest element along axis, as i64", 1, 1, 1, 1, arg_attrs, infer_arg})
      .traits.types = {input(0, kNumeric)};
  const std::vector<AttrSpec> axis_attr = {{"axis", AttrType::int64, false, "default -1"}};
  r.add("", OpSchema{"Softmax", "e^x / sum(e^x) along one axis", 1, 1, 1, 1, axis_attr, infer_axis_float})
      .traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"LogSoftmax", "log of Softmax along one axis", 1, 1, 1, 1, axis_attr, infer_axis_float})
      .traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"Hardmax", "1 at the first maximum along one axis, 0 elsewhere", 1, 1, 1, 1, axis_attr,
                     infer_axis_float}).traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"LpNormalization", "x / ||x||_p along one axis", 1, 1, 1, 1,
                     {{"axis", AttrType::int64, false, "default -1"}, {"p", AttrType::int64, false, "1 or 2 (default 2)"}},
                     infer_axis_float}).traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"CumSum", "running sum along the axis input", 2, 2, 1, 1,
                     {{"exclusive", AttrType::int64, false, "1 = exclude the current element (default 0)"},
                      {"reverse", AttrType::int64, false, "1 = sum from the end (default 0)"}},
                     infer_cumsum}).traits.types = {input(0, kNumeric), input(1, kIndex, "axis")};
  r.add("", OpSchema{"CumProd", "running product along the axis input", 2, 2, 1, 1,
                     {{"exclusive", AttrType::int64, false, "1 = exclude the current element (default 0)"},
                      {"reverse", AttrType::int64, false, "1 = multiply from the end (default 0)"}},
                     infer_cumsum}).traits.types = {input(0, kNumeric), input(1, kIndex, "axis")};
  r.add("", OpSchema{"TopK", "the K largest (or smallest) elements along axis and their i64 indices", 2, 2, 2, 2,
                     {{"axis", AttrType::int64, false, "default -1"},
                      {"largest", AttrType::int64, false, "default 1"},
                      {"sorted", AttrType::int64, false, "default 1 (results are always sorted)"}},
                     infer_topk}).traits.types = {input(0, kNumeric), input(1, DType::i64, "K")};
  r.add("", OpSchema{"LayerNormalization", "(x - mean) / sqrt(var + epsilon) * scale + B over dims axis…", 2, 3, 1, 3,
                     {{"axis", AttrType::int64, false, "first normalized dim (default -1)"},
                      {"epsilon", AttrType::float64, false, "default 1e-5"},
                      {"stash_type", AttrType::int64, false, "ONNX type code of Mean/InvStdDev (default 1 = f32)"}},
                     infer_layer_norm})
      .traits.types = {input(0, kFloat, "X"), same_as(1, 0, "scale"), same_as(2, 0, "bias")};
  r.add("", OpSchema{"QLayerNormalization", "LayerNormalization of dequantized u8/s8 x, its output quantized (made by compile)", 6, 7, 1, 1,
                     {{"axis", AttrType::int64, false, "first normalized dim (default -1)"},
                      {"epsilon", AttrType::float64, false, "default 1e-5"},
                      {"stash_type", AttrType::int64, false, "1 (f32), the default, only"}},
                     infer_qlayer_norm})
      .traits.types = {input(0, DType::u8 | DType::i8, "x"), input(1, DType::f32, "x_scale"), same_as(2, 0, "x_zero_point"),
                       same_as(3, 1, "scale"), same_as(4, 1, "y_scale"), input(5, DType::u8 | DType::i8, "y_zero_point"),
                       same_as(6, 1, "B")};
  r.add("", OpSchema{"RMSNormalization", "x / sqrt(mean(x^2) + epsilon) * scale over dims axis…", 2, 2, 1, 1,
                     {{"axis", AttrType::int64, false, "first normalized dim (default -1)"},
                      {"epsilon", AttrType::float64, false, "default 1e-5"},
                      {"stash_type", AttrType::int64, false, "ONNX type code of the computation (default 1 = f32)"}},
                     infer_layer_norm}).traits.types = {input(0, kFloat, "X"), same_as(1, 0, "scale")};
  // The per-channel parameters are float, not necessarily of X's float type.
  const std::vector<TypeConstraint> channel_norm_types = {input(0, kFloat, "X"), input(1, kFloat, "scale"),
                                                          input(2, kFloat, "B")};
  std::vector<TypeConstraint> batch_norm_types = channel_norm_types;
  batch_norm_types.push_back(input(3, kFloat, "mean"));
  batch_norm_types.push_back(input(4, kFloat, "var"));
  r.add("", OpSchema{"BatchNormalization", "inference: (x - mean) / sqrt(var + epsilon) * scale + B per channel", 5,
                     5, 1, 1, {{"epsilon", AttrType::float64, false, "default 1e-5"}}, infer_channel_norm})
      .traits.types = batch_norm_types;
  r.add("", OpSchema{"InstanceNormalization", "normalizes each (n, c) over the spatial dims, then scale and B", 3, 3,
                     1, 1, {{"epsilon", AttrType::float64, false, "default 1e-5"}}, infer_channel_norm})
      .traits.types = channel_norm_types;
  r.add("", OpSchema{"GroupNormalization", "normalizes each (n, group) then per-channel scale and bias", 3, 3, 1, 1,
                     {{"num_groups", AttrType::int64, true, "number of channel groups"},
                      {"epsilon", AttrType::float64, false, "default 1e-5"},
                      {"stash_type", AttrType::int64, false, "ONNX type code of the computation (default 1 = f32)"}},
                     infer_channel_norm})
      .traits.types = channel_norm_types;
}

}  // namespace kiln
