// Core ops of the shape family, layout part: schemas and type/shape inference for the ops that
// move data without looking at it (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat,
// Split, Slice, Pad, Tile, Expand, DepthToSpace, SpaceToDepth, CenterCropPad). Where the
// inputs' data is known and the output is tiny, the output's data is computed too, so that
// shapes computed in the graph (Shape → Gather → Concat → Reshape) stay static at export.
// The index ops (Gather, Scatter, Shape, Range, …) are in shape_index.cc.
#include <algorithm>
#include <map>
#include <set>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/bytes.h"
#include "formats/ops/shape_util.h"

namespace kiln {

using namespace shape_ops;

namespace {


// DepthToSpace/SpaceToDepth block sizes above this are refused, so blocksize² never overflows.
constexpr int64_t kMaxBlockSize = int64_t{1} << 20;

// ---- Reshape -----------------------------------------------------------------------------------

// The size of the -1 entry of a Reshape target, from the input dims and the other target dims;
// cancels symbols that appear on both sides so [batch, 128, 768] → [batch, -1, 12, 64] resolves.
Result<Dim> infer_minus_one(const Shape& in, const std::vector<Dim>& out, size_t neg, const InferContext& ctx) {
  CheckedInt in_product = 1, out_product = 1;
  std::multiset<std::string> syms;
  for (const Dim& d : in.dims) {
    if (d.is_known()) in_product *= d.value;
    else if (d.is_symbolic()) syms.insert(d.symbol);
    else return Dim::unknown();
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (i == neg) continue;
    const Dim& d = out[i];
    if (d.is_known()) { out_product *= d.value; continue; }
    if (!d.is_symbolic()) return Dim::unknown();
    auto it = syms.find(d.symbol);
    if (it == syms.end()) return Dim::unknown();
    syms.erase(it);
  }
  if (!in_product.ok()) return ctx.error("the input's dims " + in.str() + " multiply past the int64 range");
  if (!out_product.ok()) return ctx.error("the target dims multiply past the int64 range");
  int64_t known_in = in_product.value(), known_out = out_product.value();
  if (syms.empty()) {
    if (known_out == 0) {
      if (known_in == 0) return ctx.error("cannot infer the -1 dim of a reshape with a 0 dim");
      return ctx.error("cannot reshape " + in.str() + " into a shape with a 0 dim and -1");
    }
    if (known_in % known_out != 0)
      return ctx.error("cannot reshape " + in.str() + " (" + std::to_string(known_in) + " elements): the dims other than -1 multiply to " +
                       std::to_string(known_out) + ", which does not divide " + std::to_string(known_in));
    return Dim::known(known_in / known_out);
  }
  if (syms.size() == 1 && known_in == known_out) return Dim::sym(*syms.begin());
  return Dim::unknown();
}

Status infer_reshape(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  bool allowzero = ctx.node().attr_int("allowzero", 0) != 0;
  auto target = known_ints(ctx, 1);
  if (!target) {
    const Shape& ts = ctx.shape(1);
    int64_t r = ts.rank() == 1 && ts.dims[0].is_known() ? ts.dims[0].value : -1;
    if (r > kMaxRank) return ctx.error("the shape input has " + std::to_string(r) +
                                       " entries; kiln supports ranks up to " + std::to_string(kMaxRank));
    ctx.set_output(0, ctx.dtype(0), unknown_dims(r));
    return {};
  }
  if (ctx.rank(1) != 1) return ctx.error("the shape input must be 1-D, got shape " + ctx.shape(1).str());
  std::vector<Dim> out;
  int64_t neg = -1;
  bool has_zero = false;
  for (size_t i = 0; i < target->size(); ++i) {
    int64_t v = (*target)[i];
    if (v == -1) {
      if (neg >= 0) return ctx.error("the shape has more than one -1");
      neg = static_cast<int64_t>(i);
      out.push_back(Dim::unknown());
    } else if (v == 0 && !allowzero) {
      if (in.rank_known && static_cast<int64_t>(i) >= in.rank())
        return ctx.error("shape[" + std::to_string(i) + "] is 0 (copy the input dim) but the input has rank " +
                         std::to_string(in.rank()));
      out.push_back(in.rank_known ? in.dims[i] : Dim::unknown());
    } else if (v < 0) {
      return ctx.error("shape[" + std::to_string(i) + "] is " + std::to_string(v));
    } else {
      if (v == 0) has_zero = true;
      out.push_back(Dim::known(v));
    }
  }
  if (allowzero && has_zero && neg >= 0) return ctx.error("the shape has both 0 and -1 while allowzero is set");
  if (in.rank_known) {
    if (neg >= 0) {
      KILN_ASSIGN_OR_RETURN(out[static_cast<size_t>(neg)], infer_minus_one(in, out, static_cast<size_t>(neg), ctx));
    } else if (in.is_concrete() && Shape(out).is_concrete()) {
      int64_t a = shape_numel(in.concrete()), b = shape_numel(Shape(out).concrete());
      if (a != b)
        return ctx.error("cannot reshape " + in.str() + " (" + std::to_string(a) + " elements) to " + Shape(out).str() + " (" +
                         std::to_string(b) + " elements)");
    }
  }
  Shape os(std::move(out));
  const Tensor* data = ctx.fold_value(0);
  if (data && os.is_concrete() && foldable(os.concrete()) && shape_numel(os.concrete()) == data->numel()) {
    ctx.set_output_value(0, data->reshaped(os.concrete()));
    return {};
  }
  ctx.set_output(0, ctx.dtype(0), std::move(os));
  return {};
}

// ---- Flatten, Squeeze, Unsqueeze ------------------------------------------------------------------

Status infer_flatten(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), unknown_dims(2));
    return {};
  }
  int64_t r = in.rank(), axis = ctx.node().attr_int("axis", 1);
  if (axis < -r || axis > r) return ctx.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  if (axis < 0) axis += r;
  KILN_ASSIGN_OR_RETURN(Dim outer, dim_product(in, 0, static_cast<size_t>(axis), ctx));
  KILN_ASSIGN_OR_RETURN(Dim inner, dim_product(in, static_cast<size_t>(axis), in.dims.size(), ctx));
  ctx.set_output(0, ctx.dtype(0), Shape({outer, inner}));
  return {};
}

// Normalises a list of axes for `rank`, rejecting duplicates.
Result<std::vector<int64_t>> normalize_axes(const std::vector<int64_t>& axes, int64_t rank, const InferContext& ctx) {
  std::vector<int64_t> out;
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t n, normalize_axis(a, rank, ctx));
    if (std::find(out.begin(), out.end(), n) != out.end()) return ctx.error("axis " + std::to_string(a) + " is given twice");
    out.push_back(n);
  }
  return out;
}

// Sets output 0 to the input's data with a new shape when that data is known and small.
void set_reshaped(InferContext& ctx, Shape shape) {
  const Tensor* data = ctx.fold_value(0);
  if (data && shape.is_concrete() && foldable(shape.concrete())) {
    ctx.set_output_value(0, data->reshaped(shape.concrete()));
    return;
  }
  ctx.set_output(0, ctx.dtype(0), std::move(shape));
}

Status infer_squeeze(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (ctx.has_input(1)) {
    auto axes = known_ints(ctx, 1);
    if (!axes || !in.rank_known) {
      const Shape& as = ctx.shape(1);
      bool n_known = as.rank() == 1 && as.dims[0].is_known();
      ctx.set_output(0, ctx.dtype(0), in.rank_known && n_known ? unknown_dims(in.rank() - as.dims[0].value) : Shape());
      return {};
    }
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm, normalize_axes(*axes, in.rank(), ctx));
    std::vector<Dim> out;
    for (int64_t i = 0; i < in.rank(); ++i) {
      const Dim& d = in.dims[static_cast<size_t>(i)];
      if (std::find(norm.begin(), norm.end(), i) == norm.end()) { out.push_back(d); continue; }
      if (d.is_known() && d.value != 1)
        return ctx.error("cannot squeeze axis " + std::to_string(i) + " of size " + std::to_string(d.value) + " (shape " + in.str() + ")");
    }
    set_reshaped(ctx, Shape(std::move(out)));
    return {};
  }
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  std::vector<Dim> out;
  for (const Dim& d : in.dims) {
    if (!d.is_known()) {  // whether it is 1 decides the output rank
      ctx.set_output(0, ctx.dtype(0), Shape());
      return {};
    }
    if (d.value != 1) out.push_back(d);
  }
  set_reshaped(ctx, Shape(std::move(out)));
  return {};
}

Status infer_unsqueeze(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  auto axes = known_ints(ctx, 1);
  if (!axes || !in.rank_known) {
    const Shape& as = ctx.shape(1);
    bool n_known = as.rank() == 1 && as.dims[0].is_known();
    ctx.set_output(0, ctx.dtype(0), in.rank_known && n_known ? unknown_dims(in.rank() + as.dims[0].value) : Shape());
    return {};
  }
  if (ctx.rank(1) > 1) return ctx.error("axes must be 1-D, got shape " + ctx.shape(1).str());
  int64_t r = in.rank() + static_cast<int64_t>(axes->size());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm, normalize_axes(*axes, r, ctx));
  std::vector<Dim> out;
  size_t next = 0;
  for (int64_t i = 0; i < r; ++i) {
    if (std::find(norm.begin(), norm.end(), i) != norm.end()) out.push_back(Dim::known(1));
    else out.push_back(in.dims[next++]);
  }
  set_reshaped(ctx, Shape(std::move(out)));
  return {};
}

// ---- Transpose ----------------------------------------------------------------------------------

Status infer_transpose(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  std::vector<int64_t> perm = ctx.node().attr_ints("perm");
  bool has_perm = ctx.node().has_attr("perm");
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), has_perm ? unknown_dims(static_cast<int64_t>(perm.size())) : Shape());
    return {};
  }
  int64_t r = in.rank();
  if (!has_perm)
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != r)
    return ctx.error("perm has " + std::to_string(perm.size()) + " entries but the input has rank " + std::to_string(r));
  std::vector<bool> seen(static_cast<size_t>(r), false);
  std::vector<Dim> out;
  for (int64_t p : perm) {
    if (p < 0 || p >= r || seen[static_cast<size_t>(p)]) return ctx.error("perm is not a permutation of 0.." + std::to_string(r - 1));
    seen[static_cast<size_t>(p)] = true;
    out.push_back(in.dims[static_cast<size_t>(p)]);
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

// ---- Concat, Split ------------------------------------------------------------------------------

Status infer_concat(InferContext& ctx) {
  DType dt = ctx.dtype(0);
  int64_t r = -1;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.error("input " + std::to_string(i) + " is missing");
    if (ctx.rank(i) < 0) continue;
    if (r >= 0 && ctx.rank(i) != r)
      return ctx.error("input " + std::to_string(i) + " has rank " +
                       std::to_string(ctx.rank(i)) + " but another has rank " + std::to_string(r));
    r = ctx.rank(i);
  }
  if (r < 0) {
    ctx.set_output(0, dt, Shape());
    return {};
  }
  if (r == 0) return ctx.error("cannot concatenate scalars");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), r, ctx));
  std::vector<Dim> out(static_cast<size_t>(r));
  bool all_ranks = true;
  for (size_t d = 0; d < out.size(); ++d) {
    Dim acc = static_cast<int64_t>(d) == axis ? Dim::known(0) : Dim::unknown();
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      if (ctx.rank(i) < 0) { all_ranks = false; if (static_cast<int64_t>(d) == axis) acc = Dim::unknown(); continue; }
      const Dim& x = ctx.shape(i).dims[d];
      if (static_cast<int64_t>(d) == axis) {
        if (all_ranks) {
          KILN_ASSIGN_OR_RETURN(acc, dim_add(acc, x, ctx));
        }
      } else if (x.is_known()) {
        if (acc.is_known() && acc.value != x.value)
          return ctx.error("input " + std::to_string(i) + " has shape " + ctx.shape(i).str() +
                           ", which differs from the others outside axis " + std::to_string(axis));
        acc = x;
      } else if (!acc.is_known() && !acc.is_symbolic()) {
        acc = x;
      }
    }
    out[d] = acc;
  }
  Shape os(std::move(out));
  bool known = os.is_concrete() && foldable(os.concrete());
  for (size_t i = 0; i < ctx.num_inputs() && known; ++i) known = ctx.fold_value(i) != nullptr;
  if (known) {
    std::vector<int64_t> shape = os.concrete();
    Tensor t(dt, shape);
    int64_t outer = shape_numel(std::span(shape).first(static_cast<size_t>(axis)));
    int64_t inner = shape_numel(std::span(shape).subspan(static_cast<size_t>(axis) + 1));
    int64_t pos = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (size_t i = 0; i < ctx.num_inputs(); ++i) {
        const Tensor* v = ctx.fold_value(i);
        int64_t block = v->dim(axis) * inner;
        for (int64_t k = 0; k < block; ++k) copy_element(t, pos++, *v, o * block + k);
      }
    ctx.set_output_value(0, std::move(t));
    return {};
  }
  ctx.set_output(0, dt, std::move(os));
  return {};
}

// ReplaceSlices (made by compile's fold_split_concat): Y is X with slices along `axis` replaced
// by the inputs after X, update i at starts[i]; each update has X's rank and dims off the axis.
Status infer_replace_slices(InferContext& ctx) {
  const std::vector<int64_t> starts = ctx.node().attr_ints("starts");
  const size_t updates = ctx.num_inputs() - 1;
  if (starts.size() != updates)
    return ctx.error("starts has " + std::to_string(starts.size()) + " entries but the node has " +
                     std::to_string(updates) + " updates");
  const Shape& x = ctx.shape(0);
  if (x.rank_known) {
    if (x.rank() == 0) return ctx.error("cannot replace slices of a scalar");
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), x.rank(), ctx));
    for (size_t i = 0; i < updates; ++i) {
      const std::string which = "update " + std::to_string(i);
      if (!ctx.has_input(i + 1)) return ctx.error(which + " is missing");
      if (starts[i] < 0) return ctx.error(which + " starts at " + std::to_string(starts[i]));
      const Shape& u = ctx.shape(i + 1);
      if (!u.rank_known) continue;
      if (u.rank() != x.rank()) return ctx.error(which + " has rank " + std::to_string(u.rank()) + " but X has rank " + std::to_string(x.rank()));
      for (size_t d = 0; d < x.dims.size(); ++d) {
        const Dim &ud = u.dims[d], &xd = x.dims[d];
        if (static_cast<int64_t>(d) == axis) {
          if (ud.is_known() && xd.is_known() && (starts[i] > xd.value || ud.value > xd.value - starts[i]))
            return ctx.error(which + " of " + std::to_string(ud.value) + " at " + std::to_string(starts[i]) +
                             " runs past axis " + std::to_string(axis) + "'s " +
                             std::to_string(xd.value));
        } else if (ud.is_known() && xd.is_known() && ud.value != xd.value) {
          return ctx.error(which + " has shape " + u.str() + ", which differs from X's " + x.str() + " outside axis " + std::to_string(axis));
        }
      }
    }
  }
  ctx.set_output(0, ctx.dtype(0), x);
  return {};
}

Status infer_split(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  size_t n = ctx.num_outputs();
  if (ctx.node().has_attr("num_outputs") && ctx.node().attr_int("num_outputs", 0) != static_cast<int64_t>(n))
    return ctx.error("num_outputs is " + std::to_string(ctx.node().attr_int("num_outputs", 0)) + " but the node has " +
                     std::to_string(n) + " outputs");
  if (!in.rank_known) {
    for (size_t i = 0; i < n; ++i) ctx.set_output(i, ctx.dtype(0), Shape());
    return {};
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 0), in.rank(), ctx));
  const Dim& d = in.dims[static_cast<size_t>(axis)];
  std::vector<Dim> sizes(n, Dim::unknown());
  auto split = known_ints(ctx, 1);
  if (split) {
    if (split->size() != n)
      return ctx.error("split has " + std::to_string(split->size()) + " entries but the node has " +
                       std::to_string(n) + " outputs");
    CheckedInt sum = 0;
    for (size_t i = 0; i < n; ++i) {
      if ((*split)[i] < 0) return ctx.error("split[" + std::to_string(i) + "] is " + std::to_string((*split)[i]));
      sum += (*split)[i];
      sizes[i] = Dim::known((*split)[i]);
    }
    if (!sum.ok()) return ctx.error("split sizes add up past the int64 range");
    if (d.is_known() && sum.value() != d.value)
      return ctx.error("split sizes add up to " + std::to_string(sum.value()) + " but axis " + std::to_string(axis) +
                       " has size " + std::to_string(d.value));
  } else if (!ctx.has_input(1) && d.is_known()) {
    int64_t chunk = d.value / static_cast<int64_t>(n) + (d.value % static_cast<int64_t>(n) != 0);
    int64_t last = d.value - chunk * static_cast<int64_t>(n - 1);
    if (last < 0)
      return ctx.error("cannot split axis " + std::to_string(axis) + " of size " + std::to_string(d.value) +
                       " into " + std::to_string(n) +
                       " parts");
    for (size_t i = 0; i < n; ++i) sizes[i] = Dim::known(i + 1 == n ? last : chunk);
  } else if (!ctx.has_input(1) && n == 1) {
    sizes[0] = d;
  }
  for (size_t i = 0; i < n; ++i) {
    Shape s = in;
    s.dims[static_cast<size_t>(axis)] = sizes[i];
    ctx.set_output(i, ctx.dtype(0), std::move(s));
  }
  return {};
}

// ---- Slice --------------------------------------------------------------------------------------

Status infer_slice(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  int64_t r = in.rank();
  auto starts = known_ints(ctx, 1), ends = known_ints(ctx, 2);
  std::optional<std::vector<int64_t>> axes, steps;
  if (ctx.has_input(3)) axes = known_ints(ctx, 3);
  if (ctx.has_input(4)) steps = known_ints(ctx, 4);
  if ((ctx.has_input(3) && !axes) || !starts || !ends || (ctx.has_input(4) && !steps)) {
    std::vector<Dim> out(static_cast<size_t>(r), Dim::unknown());
    if (axes) {  // only the sliced axes change
      out = in.dims;
      for (int64_t a : *axes) {
        KILN_ASSIGN_OR_RETURN(int64_t n, normalize_axis(a, r, ctx));
        out[static_cast<size_t>(n)] = Dim::unknown();
      }
    }
    ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
    return {};
  }
  size_t k = starts->size();
  if (ends->size() != k) return ctx.error("starts has " + std::to_string(k) +
                                          " entries but ends has " + std::to_string(ends->size()));
  if (!axes) {
    axes.emplace();
    for (size_t i = 0; i < k; ++i) axes->push_back(static_cast<int64_t>(i));
  }
  if (!steps) steps = std::vector<int64_t>(k, 1);
  if (axes->size() != k || steps->size() != k)
    return ctx.error("starts, ends, axes and steps must have the same length");
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm, normalize_axes(*axes, r, ctx));
  std::vector<Dim> out = in.dims;
  std::vector<SliceDim> sl(static_cast<size_t>(r));
  for (size_t i = 0; i < k; ++i) {
    int64_t step = (*steps)[i];
    if (step == 0) return ctx.error("steps[" + std::to_string(i) + "] is 0");
    size_t a = static_cast<size_t>(norm[i]);
    const Dim& d = in.dims[a];
    if (d.is_known()) {
      sl[a] = slice_dim(d.value, (*starts)[i], (*ends)[i], step);
      out[a] = Dim::known(sl[a].len);
    } else if (step == 1 && (*starts)[i] == 0 && (*ends)[i] >= (int64_t{1} << 31) - 1) {
      out[a] = d;  // x[:, 0:] keeps a symbolic dim
    } else {
      out[a] = Dim::unknown();
    }
  }
  Shape os(std::move(out));
  const Tensor* data = ctx.fold_value(0);
  if (data && os.is_concrete() && foldable(os.concrete())) {
    std::vector<int64_t> shape = os.concrete();
    for (size_t a = 0; a < shape.size(); ++a)
      if (std::find(norm.begin(), norm.end(), static_cast<int64_t>(a)) == norm.end()) sl[a] = SliceDim{0, 1, shape[a]};
    std::vector<int64_t> in_strides = strides_of(data->shape());
    Tensor t(data->dtype(), shape);
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t j = 0; j < t.numel(); ++j) {
      int64_t src = 0;
      for (size_t a = 0; a < shape.size(); ++a) src += (sl[a].start + idx[a] * sl[a].step) * in_strides[a];
      copy_element(t, j, *data, src);
      for (size_t a = shape.size(); a-- > 0;) {
        if (++idx[a] < shape[a]) break;
        idx[a] = 0;
      }
    }
    ctx.set_output_value(0, std::move(t));
    return {};
  }
  ctx.set_output(0, ctx.dtype(0), std::move(os));
  return {};
}

// ---- Pad, Tile, Expand --------------------------------------------------------------------------

Status infer_pad(InferContext& ctx) {
  std::string mode = ctx.node().attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    return ctx.error("unknown pad mode '" + mode + "'; expected constant, reflect, edge or wrap");
  const Shape& in = ctx.shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  int64_t r = in.rank();
  auto pads = known_ints(ctx, 1);
  std::optional<std::vector<int64_t>> axes;
  if (ctx.has_input(3)) axes = known_ints(ctx, 3);
  if (!pads || (ctx.has_input(3) && !axes)) {
    ctx.set_output(0, ctx.dtype(0), unknown_dims(r));
    return {};
  }
  if (!axes) {
    axes.emplace();
    for (int64_t i = 0; i < r; ++i) axes->push_back(i);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm, normalize_axes(*axes, r, ctx));
  size_t k = norm.size();
  if (pads->size() != 2 * k)
    return ctx.error("pads has " + std::to_string(pads->size()) + " entries, expected " +
                     std::to_string(2 * k));
  std::vector<Dim> out = in.dims;
  for (size_t i = 0; i < k; ++i) {
    size_t a = static_cast<size_t>(norm[i]);
    std::optional<int64_t> add = checked_add((*pads)[i], (*pads)[i + k]);
    if (!add) return ctx.error("pads " + std::to_string((*pads)[i]) + " + " + std::to_string((*pads)[i + k]) + " overflow int64");
    // Pads may be negative (they crop), so the sum is not a Dim (Dim::known(-1) reads as unknown).
    if (*add == 0) continue;
    if (!in.dims[a].is_known()) {
      out[a] = Dim::unknown();
      continue;
    }
    std::optional<int64_t> size = checked_add(in.dims[a].value, *add);
    if (!size) return ctx.error("pads " + std::to_string(*add) + " overflow int64 on axis " + std::to_string(norm[i]));
    if (*size < 0) return ctx.error("pads remove more than the " + std::to_string(in.dims[a].value) + " elements of axis " + std::to_string(norm[i]));
    out[a] = Dim::known(*size);
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_tile(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  auto reps = known_ints(ctx, 1);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  if (!reps) {
    ctx.set_output(0, ctx.dtype(0), unknown_dims(in.rank()));
    return {};
  }
  if (static_cast<int64_t>(reps->size()) != in.rank())
    return ctx.error("repeats has " + std::to_string(reps->size()) +
                     " entries but the input has rank " + std::to_string(in.rank()));
  std::vector<Dim> out;
  for (size_t i = 0; i < reps->size(); ++i) {
    if ((*reps)[i] < 0) return ctx.error("repeats[" + std::to_string(i) + "] is " + std::to_string((*reps)[i]));
    KILN_ASSIGN_OR_RETURN(Dim d, dim_mul(in.dims[i], Dim::known((*reps)[i]), ctx));
    out.push_back(d);
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_expand(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  auto target = known_ints(ctx, 1);
  if (!target) {
    const Shape& ts = ctx.shape(1);
    if (!in.rank_known || ts.rank() != 1 || !ts.dims[0].is_known()) {
      ctx.set_output(0, ctx.dtype(0), Shape());
      return {};
    }
    int64_t r = std::max(in.rank(), ts.dims[0].value);
    if (r > kMaxRank) return ctx.error("the shape input has " + std::to_string(r) +
                                       " entries; kiln supports ranks up to " + std::to_string(kMaxRank));
    std::vector<Dim> out(static_cast<size_t>(r), Dim::unknown());
    for (size_t i = 0; i < in.dims.size(); ++i) {
      const Dim& d = in.dims[i];
      if (d.is_known() && d.value != 1) out[static_cast<size_t>(r) - in.dims.size() + i] = d;
    }
    ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
    return {};
  }
  for (int64_t v : *target)
    if (v < 0) return ctx.error("the shape has a negative dim " + std::to_string(v));
  KILN_ASSIGN_OR_RETURN(Shape os, broadcast_shapes(in, Shape::of(*target), ctx));
  const Tensor* data = ctx.fold_value(0);
  if (data && os.is_concrete() && foldable(os.concrete())) {
    std::vector<int64_t> shape = os.concrete();
    size_t r = shape.size(), off = r - data->shape().size();
    std::vector<int64_t> in_strides = strides_of(data->shape());
    Tensor t(data->dtype(), shape);
    std::vector<int64_t> idx(r, 0);
    for (int64_t j = 0; j < t.numel(); ++j) {
      int64_t src = 0;
      for (size_t a = off; a < r; ++a)
        if (data->dim(static_cast<int64_t>(a - off)) != 1) src += idx[a] * in_strides[a - off];
      copy_element(t, j, *data, src);
      for (size_t a = r; a-- > 0;) {
        if (++idx[a] < shape[a]) break;
        idx[a] = 0;
      }
    }
    ctx.set_output_value(0, std::move(t));
    return {};
  }
  ctx.set_output(0, ctx.dtype(0), std::move(os));
  return {};
}

// ---- DepthToSpace, SpaceToDepth, CenterCropPad --------------------------------------------------

Status infer_depth_to_space(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  int64_t b = ctx.node().attr_int("blocksize", 0);
  if (b <= 0 || b > kMaxBlockSize) return ctx.error("blocksize must be in [1, " + std::to_string(kMaxBlockSize) + "], got " + std::to_string(b));
  std::string mode = ctx.node().attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") return ctx.error("mode must be DCR or CRD, got '" + mode + "'");
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), unknown_dims(4));
    return {};
  }
  if (in.rank() != 4) return ctx.error("the input must be 4-D (NCHW), got shape " + in.str());
  const Dim& c = in.dims[1];
  if (c.is_known() && c.value % (b * b) != 0)
    return ctx.error(std::to_string(c.value) + " channels are not divisible by blocksize² = " + std::to_string(b * b));
  KILN_ASSIGN_OR_RETURN(Dim h, dim_mul(in.dims[2], Dim::known(b), ctx));
  KILN_ASSIGN_OR_RETURN(Dim w, dim_mul(in.dims[3], Dim::known(b), ctx));
  ctx.set_output(0, ctx.dtype(0), Shape({in.dims[0], c.is_known() ? Dim::known(c.value / (b * b)) : Dim::unknown(), h, w}));
  return {};
}

Status infer_space_to_depth(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  int64_t b = ctx.node().attr_int("blocksize", 0);
  if (b <= 0 || b > kMaxBlockSize) return ctx.error("blocksize must be in [1, " + std::to_string(kMaxBlockSize) + "], got " + std::to_string(b));
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), unknown_dims(4));
    return {};
  }
  if (in.rank() != 4) return ctx.error("the input must be 4-D (NCHW), got shape " + in.str());
  KILN_ASSIGN_OR_RETURN(Dim c, dim_mul(in.dims[1], Dim::known(b * b), ctx));
  std::vector<Dim> out = {in.dims[0], c, Dim::unknown(), Dim::unknown()};
  for (size_t i = 2; i < 4; ++i) {
    const Dim& d = in.dims[i];
    if (!d.is_known()) continue;
    if (d.value % b != 0) return ctx.error("dim " + std::to_string(i) + " of size " +
                                           std::to_string(d.value) + " is not divisible by blocksize " + std::to_string(b));
    out[i] = Dim::known(d.value / b);
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_center_crop_pad(InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.dtype(0), Shape());
    return {};
  }
  std::vector<int64_t> axes = ctx.node().attr_ints("axes");
  if (!ctx.node().has_attr("axes"))
    for (int64_t i = 0; i < in.rank(); ++i) axes.push_back(i);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm, normalize_axes(axes, in.rank(), ctx));
  auto target = known_ints(ctx, 1);
  std::vector<Dim> out = in.dims;
  if (target && target->size() != norm.size())
    return ctx.error("the shape input has " + std::to_string(target->size()) + " entries but there are " +
                     std::to_string(norm.size()) + " axes");
  for (size_t i = 0; i < norm.size(); ++i) {
    if (target && (*target)[i] < 0) return ctx.error("the shape has a negative dim " + std::to_string((*target)[i]));
    out[static_cast<size_t>(norm[i])] = target ? Dim::known((*target)[i]) : Dim::unknown();
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

}  // namespace

void register_shape_index_ops(OpRegistry& r);

void register_shape_ops(OpRegistry& r) {
  using namespace types;
  r.add("", OpSchema{"Reshape", "the data with a new shape (0 copies an input dim unless allowzero, -1 is inferred)",
                     2, 2, 1, 1, {{"allowzero", AttrType::int64, false, "0: a 0 copies the input dim; 1: a 0 is a 0 dim"}},
                     infer_reshape})
      .traits = {.types = {input(1, kIndex, "the shape input")}, .pass_through = OpTraits::PassThrough::first};
  r.add("", OpSchema{"Flatten", "reshape to 2-D: dims before axis, dims from axis", 1, 1, 1, 1,
                     {{"axis", AttrType::int64, false, "default 1, in [-rank, rank]"}}, infer_flatten})
      .traits.pass_through = OpTraits::PassThrough::first;
  r.add("", OpSchema{"Squeeze", "removes size-1 dims (the given axes, or all)", 1, 2, 1, 1, {}, infer_squeeze})
      .traits = {.types = {input(1, kIndex, "axes")}, .pass_through = OpTraits::PassThrough::first};
  r.add("", OpSchema{"Unsqueeze", "inserts size-1 dims at the given axes of the output", 2, 2, 1, 1, {}, infer_unsqueeze})
      .traits = {.types = {input(1, kIndex, "axes")}, .pass_through = OpTraits::PassThrough::first};
  r.add("", OpSchema{"Transpose", "permutes the dims", 1, 1, 1, 1,
                     {{"perm", AttrType::ints, false, "output dim i is input dim perm[i]; default reversed"}}, infer_transpose})
      .traits.pass_through = OpTraits::PassThrough::first;
  r.add("", OpSchema{"Concat", "joins tensors along an axis", 1, kVariadic, 1, 1,
                     {{"axis", AttrType::int64, true, "the axis, negative counts from the end"}}, infer_concat})
      .traits = {.types = {rest_same_as(1, 0)}, .pass_through = OpTraits::PassThrough::all};
  r.add("", OpSchema{"Split", "splits along an axis into the given sizes, or equal parts (the last smaller)", 1, 2, 1, kVariadic,
                     {{"axis", AttrType::int64, false, "default 0"},
                      {"num_outputs", AttrType::int64, false, "the number of outputs when split is absent"}},
                     infer_split}).traits.types = {input(1, kIndex, "split")};
  r.add("", OpSchema{"ReplaceSlices", "X with slices along an axis replaced by the updates (a Concat of a Split's pieces, some unchanged)",
                     2, kVariadic, 1, 1,
                     {{"axis", AttrType::int64, true, "the axis, negative counts from the end"},
                      {"starts", AttrType::ints, true, "where each update begins along the axis"}},
                     infer_replace_slices})
      .traits = {.types = {rest_same_as(1, 0)}, .pass_through = OpTraits::PassThrough::all};
  r.add("", OpSchema{"Slice", "strided slice along some axes, with ONNX clamping", 3, 5, 1, 1, {}, infer_slice})
      .traits = {.types = {input(1, kIndex, "starts"), input(2, kIndex, "ends"), input(3, kIndex, "axes"),
                           input(4, kIndex, "steps")},
                 .bytes = bytes::selection,
                 .pass_through = OpTraits::PassThrough::first};
  r.add("", OpSchema{"Pad", "pads (or crops, with negative pads) the given axes", 2, 4, 1, 1,
                     {{"mode", AttrType::string, false, "constant (default), reflect, edge or wrap"}}, infer_pad})
      .traits.types = {input(1, kIndex, "pads"), same_as(2, 0, "constant_value"), input(3, kIndex, "axes")};
  r.add("", OpSchema{"Tile", "repeats the input along each axis", 2, 2, 1, 1, {}, infer_tile})
      .traits.types = {input(1, kIndex, "repeats")};
  r.add("", OpSchema{"Expand", "broadcasts the input to a shape (numpy rules)", 2, 2, 1, 1, {}, infer_expand})
      .traits = {.types = {input(1, kIndex, "the shape input")}, .pass_through = OpTraits::PassThrough::first};
  r.add("", OpSchema{"DepthToSpace", "moves channel blocks into spatial blocks (NCHW)", 1, 1, 1, 1,
                     {{"blocksize", AttrType::int64, true, "the block edge"},
                      {"mode", AttrType::string, false, "DCR (default) or CRD"}},
                     infer_depth_to_space});
  r.add("", OpSchema{"SpaceToDepth", "moves spatial blocks into channels (NCHW)", 1, 1, 1, 1,
                     {{"blocksize", AttrType::int64, true, "the block edge"}}, infer_space_to_depth});
  r.add("", OpSchema{"CenterCropPad", "center-crops or zero-pads the given axes to a shape", 2, 2, 1, 1,
                     {{"axes", AttrType::ints, false, "default: every axis"}}, infer_center_crop_pad})
      .traits = {.types = {input(1, kIndex, "the shape input")}, .bytes = bytes::selection};
  register_shape_index_ops(r);
}

}  // namespace kiln
