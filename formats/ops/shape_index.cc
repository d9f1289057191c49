// Core ops of the shape family, index part: schemas and type/shape inference for the ops that
// read indices or produce shapes (Gather, GatherElements, GatherND, ScatterElements, ScatterND,
// Shape, Size, ConstantOfShape, Range, OneHot, Trilu, EyeLike, Compress, NonZero, Unique,
// ReverseSequence). Shape, Size, Gather, ConstantOfShape and Range compute their output's data
// when it is tiny and the inputs' data is known (shape arithmetic at export).
#include <cmath>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/bytes.h"
#include "formats/ops/shape_util.h"

namespace kiln {

using namespace shape_ops;

namespace {


// ---- Gather family ------------------------------------------------------------------------------

Status infer_gather(InferContext& ctx) {
  const Shape& data = ctx.shape(0);
  const Shape& ind = ctx.shape(1);
  if (!data.rank_known || !ind.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  if (data.rank() == 0) return ctx.error("cannot gather from a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), data.rank(), ctx));
  std::vector<Dim> out(data.dims.begin(), data.dims.begin() + axis);
  out.insert(out.end(), ind.dims.begin(), ind.dims.end());
  out.insert(out.end(), data.dims.begin() + axis + 1, data.dims.end());
  Shape os(std::move(out));
  const Tensor* dv = ctx.fold_value(0);
  const Tensor* iv = ctx.fold_value(1);
  if (dv && iv && os.is_concrete() && foldable(os.concrete())) {
    int64_t n = dv->dim(axis);
    int64_t outer = shape_numel(std::span(dv->shape()).first(static_cast<size_t>(axis)));
    int64_t inner = shape_numel(std::span(dv->shape()).subspan(static_cast<size_t>(axis) + 1));
    Tensor t(dv->dtype(), os.concrete());
    int64_t pos = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < iv->numel(); ++k) {
        KILN_ASSIGN_OR_RETURN(int64_t idx, check_index(iv->as_int64(k), n, axis, ctx));
        for (int64_t j = 0; j < inner; ++j) copy_element(t, pos++, *dv, (o * n + idx) * inner + j);
      }
    ctx.set_output_value(0, std::move(t));
    return {};
  }
  ctx.set_output(0, ctx.dtype(0), std::move(os));
  return {};
}

Status infer_gather_elements(InferContext& ctx) {
  const Shape& data = ctx.shape(0);
  const Shape& ind = ctx.shape(1);
  if (data.rank_known && ind.rank_known) {
    if (data.rank() != ind.rank())
      return ctx.error("data has rank " + std::to_string(data.rank()) + " but indices have rank " + std::to_string(ind.rank()));
    if (data.rank() == 0) return ctx.error("cannot gather from a scalar");
    KILN_RETURN_IF_ERROR(normalize_axis(ctx.node().attr_int("axis", 0), data.rank(), ctx).status());
  }
  ctx.set_output(0, ctx.dtype(0), ind);
  return {};
}

Status infer_gather_nd(InferContext& ctx) {
  const Shape& data = ctx.shape(0);
  const Shape& ind = ctx.shape(1);
  int64_t b = ctx.node().attr_int("batch_dims", 0);
  if (!data.rank_known || !ind.rank_known || ind.rank() == 0 || !ind.dims.back().is_known()) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  int64_t r = data.rank(), q = ind.rank(), k = ind.dims.back().value;
  if (r < 1 || q < 1) return ctx.error("data and indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q)) return ctx.error("batch_dims " + std::to_string(b) + " must be in [0, " + std::to_string(std::min(r, q)) + ")");
  if (k < 1 || k > r - b)
    return ctx.error("the last dim of indices is " + std::to_string(k) + " but must be in [1, " + std::to_string(r - b) + "]");
  for (int64_t i = 0; i < b; ++i) {
    const Dim& x = data.dims[static_cast<size_t>(i)];
    const Dim& y = ind.dims[static_cast<size_t>(i)];
    if (x.is_known() && y.is_known() && x.value != y.value)
      return ctx.error("batch dim " + std::to_string(i) + " is " + std::to_string(x.value) + " in data but " +
                       std::to_string(y.value) + " in indices");
  }
  std::vector<Dim> out(ind.dims.begin(), ind.dims.end() - 1);
  out.insert(out.end(), data.dims.begin() + b + k, data.dims.end());
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status check_reduction(const InferContext& ctx) {
  std::string red = ctx.node().attr_string("reduction", "none");
  if (red != "none" && red != "add" && red != "mul" && red != "max" && red != "min")
    return ctx.error("unknown reduction '" + red + "'; expected none, add, mul, max or min");
  return {};
}

Status infer_scatter_elements(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_reduction(ctx));
  const Shape& data = ctx.shape(0);
  const Shape& ind = ctx.shape(1);
  const Shape& upd = ctx.shape(2);
  if (data.rank_known && ind.rank_known && data.rank() != ind.rank())
    return ctx.error("data has rank " + std::to_string(data.rank()) + " but indices have rank " + std::to_string(ind.rank()));
  if (ind.rank_known && upd.rank_known) {
    if (ind.rank() != upd.rank()) return ctx.error("indices have shape " + ind.str() + " but updates have " + upd.str());
    for (size_t i = 0; i < ind.dims.size(); ++i)
      if (ind.dims[i].is_known() && upd.dims[i].is_known() && ind.dims[i].value != upd.dims[i].value)
        return ctx.error("indices have shape " + ind.str() + " but updates have " + upd.str());
  }
  if (data.rank_known) {
    if (data.rank() == 0) return ctx.error("cannot scatter into a scalar");
    KILN_RETURN_IF_ERROR(normalize_axis(ctx.node().attr_int("axis", 0), data.rank(), ctx).status());
  }
  ctx.set_output(0, ctx.dtype(0), data);
  return {};
}

Status infer_scatter_nd(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_reduction(ctx));
  const Shape& data = ctx.shape(0);
  const Shape& ind = ctx.shape(1);
  const Shape& upd = ctx.shape(2);
  if (data.rank_known && ind.rank_known && ind.rank() >= 1 && ind.dims.back().is_known() && upd.rank_known) {
    int64_t r = data.rank(), q = ind.rank(), k = ind.dims.back().value;
    if (k > r) return ctx.error("the last dim of indices is " + std::to_string(k) + " but the data has rank " + std::to_string(r));
    if (upd.rank() != q - 1 + r - k)
      return ctx.error("updates have shape " + upd.str() + " but indices " + ind.str() + " and data " + data.str() +
                       " need rank " + std::to_string(q - 1 + r - k));
  }
  ctx.set_output(0, ctx.dtype(0), data);
  return {};
}

// ---- Shape, Size, ConstantOfShape, Range --------------------------------------------------------

Status infer_shape(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, DType::i64, unknown_dims(1));
    return {};
  }
  int64_t r = in.rank();
  auto clampi = [r](int64_t v) { if (v < 0) v += r; return v < 0 ? 0 : v > r ? r : v; };
  int64_t start = clampi(ctx.node().attr_int("start", 0));
  int64_t end = ctx.node().has_attr("end") ? clampi(ctx.node().attr_int("end", r)) : r;
  int64_t n = std::max<int64_t>(end - start, 0);
  std::vector<int64_t> dims;
  for (int64_t i = start; i < start + n; ++i) {
    const Dim& d = in.dims[static_cast<size_t>(i)];
    if (!d.is_known()) {
      ctx.set_output(0, DType::i64, Shape({Dim::known(n)}));
      return {};
    }
    dims.push_back(d.value);
  }
  ctx.set_output_value(0, int64_tensor(dims));
  return {};
}

Status infer_size(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (in.is_concrete()) ctx.set_output_value(0, Tensor::from<int64_t>({}, {shape_numel(in.concrete())}));
  else ctx.set_output(0, DType::i64, Shape(std::vector<Dim>{}));
  return {};
}

Status infer_constant_of_shape(InferContext& ctx) {
  const Tensor* value = ctx.node().attr_tensor("value");
  if (value && value->numel() != 1) return ctx.error("value must have one element, got " + std::to_string(value->numel()));
  DType out_dt = value ? value->dtype() : DType::f32;
  auto shape = known_ints(ctx, 0);
  if (!shape) {
    const Shape& s = ctx.shape(0);
    ctx.set_output(0, out_dt, s.rank() == 1 && s.dims[0].is_known() ? unknown_dims(s.dims[0].value) : Shape());
    return {};
  }
  if (ctx.rank(0) > 1) return ctx.error("the shape input must be 1-D, got shape " + ctx.shape(0).str());
  for (int64_t v : *shape)
    if (v < 0) return ctx.error("the shape has a negative dim " + std::to_string(v));
  if (foldable(*shape)) {
    Tensor t(out_dt, *shape);
    if (value)
      for (int64_t i = 0; i < t.numel(); ++i) copy_element(t, i, *value, 0);
    ctx.set_output_value(0, std::move(t));
    return {};
  }
  ctx.set_output(0, out_dt, Shape::of(*shape));
  return {};
}

Status infer_range(InferContext& ctx) {
  DType t = ctx.dtype(0);
  for (size_t i = 0; i < 3; ++i)
    if (ctx.rank(i) > 1 || (ctx.shape(i).is_concrete() && shape_numel(ctx.shape(i).concrete()) != 1))
      return ctx.error("start, limit and delta must be scalars, got shape " + ctx.shape(i).str());
  const Tensor* s = ctx.value(0);
  const Tensor* l = ctx.value(1);
  const Tensor* d = ctx.value(2);
  if (!s || !l || !d) {
    ctx.set_output(0, t, unknown_dims(1));
    return {};
  }
  int64_t n = 0;
  if (is_float(t)) {
    double start = s->as_double(0), delta = d->as_double(0);
    if (delta == 0) return ctx.error("delta is 0");
    double count = std::ceil((l->as_double(0) - start) / delta);
    if (!(count < 1e12)) return ctx.error("the range has too many elements");
    n = count > 0 ? static_cast<int64_t>(count) : 0;
  } else {
    int64_t start = s->as_int64(0), delta = d->as_int64(0), limit = l->as_int64(0);
    if (delta == 0) return ctx.error("delta is 0");
    // Exact: a count rounded in double could take the last element past limit, out of int64.
    uint64_t count = range_count(start, limit, delta);
    if (count >= uint64_t{1000000000000}) return ctx.error("the range has too many elements");
    n = static_cast<int64_t>(count);
  }
  if (n <= kFoldLimit) {
    Tensor out(t, {n});
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      T* o = out.data<T>();
      if constexpr (std::is_same_v<T, bool>) {
      } else if constexpr (std::is_same_v<T, double>) {
        for (int64_t i = 0; i < n; ++i) o[i] = s->as_double(0) + static_cast<double>(i) * d->as_double(0);
      } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>) {
        double start = s->as_double(0), delta = d->as_double(0);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(static_cast<float>(start + static_cast<double>(i) * delta));
      } else {
        int64_t start = s->as_int64(0), delta = d->as_int64(0);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(range_element(start, delta, i));
      }
    });
    ctx.set_output_value(0, std::move(out));
    return {};
  }
  ctx.set_output(0, t, Shape({Dim::known(n)}));
  return {};
}

// ---- OneHot, Trilu, EyeLike ---------------------------------------------------------------------

Status infer_one_hot(InferContext& ctx) {
  const Shape& ind = ctx.shape(0);
  if (ctx.shape(2).is_concrete() && shape_numel(ctx.shape(2).concrete()) != 2)
    return ctx.error("values must have 2 elements (off, on), got shape " + ctx.shape(2).str());
  if (ctx.shape(1).is_concrete() && shape_numel(ctx.shape(1).concrete()) != 1)
    return ctx.error("depth must have one element, got shape " + ctx.shape(1).str());
  if (!ind.rank_known) {
    ctx.set_output(0, ctx.dtype(2), Shape());
    return {};
  }
  int64_t r = ind.rank() + 1;
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", -1), r, ctx));
  Dim depth = Dim::unknown();
  if (const Tensor* d = ctx.value(1)) {
    int64_t v = static_cast<int64_t>(d->as_double(0));
    if (v < 1) return ctx.error("depth must be at least 1, got " + std::to_string(v));
    depth = Dim::known(v);
  }
  std::vector<Dim> out = ind.dims;
  out.insert(out.begin() + axis, depth);
  ctx.set_output(0, ctx.dtype(2), Shape(std::move(out)));
  return {};
}

Status infer_trilu(InferContext& ctx) {
  if (ctx.rank(0) >= 0 && ctx.rank(0) < 2) return ctx.error("the input must have rank >= 2, got shape " + ctx.shape(0).str());
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

Status infer_eye_like(InferContext& ctx) {
  DType out = ctx.dtype(0);
  if (ctx.node().has_attr("dtype")) {
    std::string name = ctx.node().attr_string("dtype", "");
    auto t = dtype_from_name(name);
    if (!t) return ctx.error("unknown dtype '" + name + "'");
    out = *t;
  }
  if (ctx.rank(0) >= 0 && ctx.rank(0) != 2) return ctx.error("the input must be 2-D, got shape " + ctx.shape(0).str());
  ctx.set_output(0, out, ctx.rank(0) < 0 ? unknown_dims(2) : ctx.shape(0));
  return {};
}

// ---- Compress, NonZero, Unique, ReverseSequence (data-dependent or per-batch) -------------------

Status infer_compress(InferContext& ctx) {
  if (ctx.rank(1) >= 0 && ctx.rank(1) != 1) return ctx.error("condition must be 1-D, got shape " + ctx.shape(1).str());
  const Shape& in = ctx.shape(0);
  if (!ctx.node().has_attr("axis")) {
    ctx.set_output(0, ctx.dtype(0), unknown_dims(1));
    return {};
  }
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), in.rank(), ctx));
  Shape out = in;
  out.dims[static_cast<size_t>(axis)] = Dim::unknown();
  ctx.set_output(0, ctx.dtype(0), std::move(out));
  return {};
}

Status infer_non_zero(InferContext& ctx) {
  ctx.set_output(0, DType::i64, Shape({ctx.rank(0) >= 0 ? Dim::known(ctx.rank(0)) : Dim::unknown(), Dim::unknown()}));
  return {};
}

Status infer_unique(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  Dim n = Dim::unknown();
  if (in.rank_known) {
    KILN_ASSIGN_OR_RETURN(n, dim_product(in, 0, in.dims.size(), ctx));
  }
  if (ctx.node().has_attr("axis") && in.rank_known) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), in.rank(), ctx));
    Shape y = in;
    y.dims[static_cast<size_t>(axis)] = Dim::unknown();
    n = in.dims[static_cast<size_t>(axis)];
    ctx.set_output(0, ctx.dtype(0), std::move(y));
  } else {
    ctx.set_output(0, ctx.dtype(0), ctx.node().has_attr("axis") ? Shape() : unknown_dims(1));
  }
  ctx.set_output(1, DType::i64, unknown_dims(1));
  ctx.set_output(2, DType::i64, Shape({n}));
  ctx.set_output(3, DType::i64, unknown_dims(1));
  return {};
}

Status infer_reverse_sequence(InferContext& ctx) {
  int64_t b = ctx.node().attr_int("batch_axis", 1), t = ctx.node().attr_int("time_axis", 0);
  if ((b != 0 && b != 1) || (t != 0 && t != 1) || b == t)
    return ctx.error("batch_axis and time_axis must be 0 and 1 in some order, got " + std::to_string(b) + " and " + std::to_string(t));
  if (ctx.rank(0) >= 0 && ctx.rank(0) < 2) return ctx.error("the input must have rank >= 2, got shape " + ctx.shape(0).str());
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

// ---- index bounds (OpTraits::index_bound): what random test inputs must stay below ----

// Size of dim `axis` (may be negative) of value `v`, when the graph knows it.
std::optional<int64_t> known_dim(const Graph& g, ValueId v, int64_t axis) {
  if (v == kNoValue) return std::nullopt;
  const Value& val = g.value(v);
  std::vector<int64_t> dims;
  if (val.is_constant()) {
    dims = val.constant.shape();
  } else {
    if (!val.shape.rank_known) return std::nullopt;
    for (const Dim& d : val.shape.dims) dims.push_back(d.is_known() ? d.value : -1);
  }
  int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || dims[static_cast<size_t>(axis)] < 0) return std::nullopt;
  return dims[static_cast<size_t>(axis)];
}

// Gather, GatherElements, ScatterElements: indices (input 1) into the data's dim `axis`.
std::optional<IndexBound> along_axis_bound(const Graph& g, const Node& n, size_t slot, bool, std::span<const int64_t>) {
  if (slot != 1 || n.inputs.empty()) return std::nullopt;
  auto d = known_dim(g, n.inputs[0], n.attr_int("axis", 0));
  if (!d) return std::nullopt;
  return IndexBound{*d, {}, "indices of " + n.op + " " + n.where() + " into a dim of size " + std::to_string(*d)};
}

// GatherND, ScatterND: position k of the indices' last axis indexes the data's dim
// batch_dims + k.
std::optional<IndexBound> nd_bound(const Graph& g, const Node& n, size_t slot, bool direct, std::span<const int64_t> shape) {
  if (slot != 1 || !direct || shape.empty() || n.inputs.empty()) return std::nullopt;
  const int64_t batch = n.op == "GatherND" ? n.attr_int("batch_dims", 0) : 0;
  IndexBound b;
  for (int64_t k = 0; k < shape.back(); ++k) {
    auto d = known_dim(g, n.inputs[0], batch + k);
    if (!d || batch + k < 0) return std::nullopt;
    b.hi_per_last_axis.push_back(*d);
  }
  if (b.hi_per_last_axis.empty()) return std::nullopt;
  std::string dims;
  for (int64_t d : b.hi_per_last_axis) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  b.reason = "indices of " + n.op + " " + n.where() + " into dims " + dims;
  return b;
}

// OneHot: indices (input 0) below a constant depth.
std::optional<IndexBound> one_hot_bound(const Graph& g, const Node& n, size_t slot, bool, std::span<const int64_t>) {
  if (slot != 0 || !n.has_input(1)) return std::nullopt;
  const Value& depth = g.value(n.inputs[1]);
  if (!depth.is_constant() || depth.constant.numel() != 1) return std::nullopt;
  const double d = depth.constant.as_double(0);
  if (!(d >= 1) || d > 9.2e18) return std::nullopt;
  const int64_t hi = static_cast<int64_t>(d);
  return IndexBound{hi, {}, "indices of OneHot " + n.where() + " with depth " + std::to_string(hi)};
}

}  // namespace

/// Registers the index half of the shape family (called from register_shape_ops).
void register_shape_index_ops(OpRegistry& r) {
  using namespace types;
  r.add("", OpSchema{"Gather", "takes entries of the data along an axis at the given indices", 2, 2, 1, 1,
                     {{"axis", AttrType::int64, false, "default 0"}}, infer_gather})
      .traits = {.types = {input(1, kIndex, "indices")}, .bytes = bytes::selection, .index_bound = along_axis_bound};
  r.add("", OpSchema{"GatherElements", "out[i][j] = data[indices[i][j]][j] along axis", 2, 2, 1, 1,
                     {{"axis", AttrType::int64, false, "default 0"}}, infer_gather_elements})
      .traits = {.types = {input(1, kIndex, "indices")}, .bytes = bytes::selection, .index_bound = along_axis_bound};
  r.add("", OpSchema{"GatherND", "gathers slices addressed by the last dim of indices", 2, 2, 1, 1,
                     {{"batch_dims", AttrType::int64, false, "leading dims shared by data and indices, default 0"}},
                     infer_gather_nd})
      .traits = {.types = {input(1, DType::i64, "indices")}, .bytes = bytes::selection, .index_bound = nd_bound};
  r.add("", OpSchema{"ScatterElements", "copy of the data with updates written (or reduced) at indices along axis", 3, 3, 1, 1,
                     {{"axis", AttrType::int64, false, "default 0"},
                      {"reduction", AttrType::string, false, "none (default), add, mul, max or min"}},
                     infer_scatter_elements})
      .traits = {.types = {input(1, kIndex, "indices"), same_as(2, 0, "updates")}, .index_bound = along_axis_bound};
  r.add("", OpSchema{"ScatterND", "copy of the data with update slices written (or reduced) at indices", 3, 3, 1, 1,
                     {{"reduction", AttrType::string, false, "none (default), add, mul, max or min"}}, infer_scatter_nd})
      .traits = {.types = {input(1, DType::i64, "indices"), same_as(2, 0, "updates")}, .index_bound = nd_bound};
  r.add("", OpSchema{"Shape", "the input's shape (dims start..end) as i64", 1, 1, 1, 1,
                     {{"start", AttrType::int64, false, "default 0"}, {"end", AttrType::int64, false, "default rank"}},
                     infer_shape}).traits.bytes = bytes::output_only;
  r.add("", OpSchema{"Size", "the input's element count as an i64 scalar", 1, 1, 1, 1, {}, infer_size})
      .traits.bytes = bytes::output_only;
  r.add("", OpSchema{"ConstantOfShape", "a tensor of the given shape filled with value", 1, 1, 1, 1,
                     {{"value", AttrType::tensor, false, "one element; its dtype is the output's; default f32 0"}},
                     infer_constant_of_shape}).traits.types = {input(0, DType::i64, "the shape input")};
  r.add("", OpSchema{"Range", "start, start + delta, … up to (excluding) limit", 3, 3, 1, 1, {}, infer_range})
      .traits.types = {input(0, kNumeric, "start"), same_as(1, 0, "limit"), same_as(2, 0, "delta")};
  r.add("", OpSchema{"OneHot", "one-hot encoding: values[1] at the index, values[0] elsewhere", 3, 3, 1, 1,
                     {{"axis", AttrType::int64, false, "where the depth axis goes, default -1"}}, infer_one_hot})
      .traits = {.types = {input(0, kNumeric, "indices"), input(1, kNumeric, "depth")}, .index_bound = one_hot_bound};
  r.add("", OpSchema{"Trilu", "keeps the upper or lower triangle of the last two dims", 1, 2, 1, 1,
                     {{"upper", AttrType::int64, false, "1 (default): upper; 0: lower"}}, infer_trilu})
      .traits.types = {input(1, DType::i64, "k")};
  r.add("", OpSchema{"EyeLike", "a 2-D tensor with ones on the k-th diagonal", 1, 1, 1, 1,
                     {{"dtype", AttrType::string, false, "output dtype name, default the input's"},
                      {"k", AttrType::int64, false, "diagonal offset, default 0"}},
                     infer_eye_like}).traits.bytes = bytes::output_only;
  r.add("", OpSchema{"Compress", "keeps the slices where condition is true", 2, 2, 1, 1,
                     {{"axis", AttrType::int64, false, "default: flatten the input first"}}, infer_compress})
      .traits = {.types = {input(1, kBool, "condition")}, .bytes = bytes::selection};
  r.add("", OpSchema{"NonZero", "indices of the non-zero elements, [rank, count]", 1, 1, 1, 1, {}, infer_non_zero});
  r.add("", OpSchema{"Unique", "unique elements or slices, with indices, inverse indices and counts", 1, 1, 1, 4,
                     {{"axis", AttrType::int64, false, "default: flatten the input"},
                      {"sorted", AttrType::int64, false, "1 (default): ascending; 0: first-occurrence order"}},
                     infer_unique});
  r.add("", OpSchema{"ReverseSequence", "reverses the first sequence_lens[b] steps of each batch", 2, 2, 1, 1,
                     {{"batch_axis", AttrType::int64, false, "default 1"}, {"time_axis", AttrType::int64, false, "default 0"}},
                     infer_reverse_sequence}).traits.types = {input(1, DType::i64, "sequence_lens")};
}

}  // namespace kiln
