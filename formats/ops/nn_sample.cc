// Core ops of the nn family that resample or contract: Resize, Einsum, GridSample, RoiAlign,
// AffineGrid (schemas and type/shape inference), plus the Resize and Einsum helpers the
// reference kernels share (formats/ops/nn_util.h).
#include <algorithm>
#include <cmath>
#include <set>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/nn_util.h"

namespace kiln {

namespace nn {

Result<ResizeGeometry> resolve_resize(const Node& node, const std::vector<int64_t>& in, const Tensor* scales,
                                      const Tensor* sizes) {
  const int64_t r = static_cast<int64_t>(in.size());
  if (scales && scales->numel() == 0) scales = nullptr;
  if (sizes && sizes->numel() == 0) sizes = nullptr;
  if (!scales == !sizes)
    return user_error(node.where(), scales ? "only one of scales and sizes may be given" : "one of scales and sizes must be given");
  ResizeGeometry g;
  std::vector<int64_t> axes = node.attr_ints("axes");
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  for (int64_t& a : axes) {
    if (a < -r || a >= r) return user_error(node.where(), "axis " + std::to_string(a) + " is out of range for rank " + std::to_string(r));
    if (a < 0) a += r;
  }
  if (std::set<int64_t>(axes.begin(), axes.end()).size() != axes.size()) return user_error(node.where(), "axes has duplicates");
  g.axes = axes;
  g.out = in;
  g.scales.assign(in.size(), 1.0);
  const Tensor* given = scales ? scales : sizes;
  if (given->numel() != static_cast<int64_t>(axes.size()))
    return user_error(node.where(), std::string(scales ? "scales" : "sizes") + " has " + std::to_string(given->numel()) +
                                        " values but " + std::to_string(axes.size()) + " axes are resized");
  if (scales) {
    for (size_t i = 0; i < axes.size(); ++i) {
      double s = scales->as_double(static_cast<int64_t>(i));
      if (!(s > 0)) return user_error(node.where(), "scale " + std::to_string(s) + " must be positive");
      size_t a = static_cast<size_t>(axes[i]);
      g.scales[a] = s;
      if (in[a] < 0) continue;
      std::optional<int64_t> out = float_to_int64(std::floor(s * static_cast<double>(in[a])));
      if (!out) return user_error(node.where(), "scale " + std::to_string(s) + " makes axis " + std::to_string(a) + " larger than int64");
      g.out[a] = *out;
    }
    return g;
  }
  std::string policy = node.attr_string("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    return user_error(node.where(), "keep_aspect_ratio_policy '" + policy + "' is not one of stretch, not_larger, not_smaller");
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t v = sizes->as_int64(static_cast<int64_t>(i));
    if (v < 0) return user_error(node.where(), "size " + std::to_string(v) + " is negative");
    size_t a = static_cast<size_t>(axes[i]);
    g.out[a] = v;
    if (in[a] > 0) g.scales[a] = static_cast<double>(v) / static_cast<double>(in[a]);
  }
  if (policy != "stretch") {
    double s = policy == "not_larger" ? 1e300 : 0;
    for (int64_t a : axes) {
      if (in[static_cast<size_t>(a)] < 0) return g;  // sizes depend on unknown dims
      s = policy == "not_larger" ? std::min(s, g.scales[static_cast<size_t>(a)]) : std::max(s, g.scales[static_cast<size_t>(a)]);
    }
    for (int64_t a : axes) {
      g.scales[static_cast<size_t>(a)] = s;
      g.out[static_cast<size_t>(a)] = static_cast<int64_t>(s * static_cast<double>(in[static_cast<size_t>(a)]) + 0.5);
    }
  }
  return g;
}

Result<EinsumSpec> parse_einsum(const Node& node, const std::string& equation, const std::vector<int64_t>& ranks) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != ranks.size())
    return user_error(node.where(), "equation '" + equation + "' has " + std::to_string(terms.size()) + " operands but " +
                                        std::to_string(ranks.size()) + " inputs are given");
  auto label_of = [](char c) { return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? 26 + (c - 'a') : -1; };
  // Splits a term into letters before and after its ellipsis.
  struct Term { std::vector<int> head, tail; bool ellipsis = false; };
  auto parse_term = [&](const std::string& t, Term& out) -> Status {
    size_t dots = t.find("...");
    if (dots != std::string::npos && t.find("...", dots + 1) != std::string::npos)
      return user_error(node.where(), "equation '" + equation + "' has two ellipses in one operand");
    out.ellipsis = dots != std::string::npos;
    for (size_t i = 0; i < t.size(); ++i) {
      if (out.ellipsis && i == dots) { i += 2; continue; }
      int l = label_of(t[i]);
      if (l < 0) return user_error(node.where(), "equation '" + equation + "' has an invalid character '" + std::string(1, t[i]) + "'");
      (out.ellipsis && i > dots ? out.tail : out.head).push_back(l);
    }
    return {};
  };
  std::vector<Term> parsed(terms.size());
  int64_t ell_rank = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    KILN_RETURN_IF_ERROR(parse_term(terms[i], parsed[i]));
    int64_t letters = static_cast<int64_t>(parsed[i].head.size() + parsed[i].tail.size());
    if (ranks[i] >= 0) {
      if (parsed[i].ellipsis ? ranks[i] < letters : ranks[i] != letters)
        return user_error(node.where(), "operand " + std::to_string(i) + " '" + terms[i] + "' does not match its rank " +
                                            std::to_string(ranks[i]));
      if (parsed[i].ellipsis) ell_rank = std::max(ell_rank, ranks[i] - letters);
    } else if (parsed[i].ellipsis) {
      return user_error(node.where(), "operand " + std::to_string(i) + " has an ellipsis but an unknown rank");
    }
  }
  EinsumSpec spec;
  spec.num_labels = 52 + static_cast<int>(ell_rank);
  std::vector<int> count(static_cast<size_t>(spec.num_labels), 0);
  for (size_t i = 0; i < parsed.size(); ++i) {
    std::vector<int> labels = parsed[i].head;
    if (parsed[i].ellipsis) {
      int64_t n = ranks[i] - static_cast<int64_t>(parsed[i].head.size() + parsed[i].tail.size());
      for (int64_t k = 0; k < n; ++k) labels.push_back(52 + static_cast<int>(ell_rank - n + k));
    }
    labels.insert(labels.end(), parsed[i].tail.begin(), parsed[i].tail.end());
    for (int l : labels) ++count[static_cast<size_t>(l)];
    spec.inputs.push_back(std::move(labels));
  }
  if (arrow != std::string::npos) {
    Term out;
    KILN_RETURN_IF_ERROR(parse_term(eq.substr(arrow + 2), out));
    spec.output = out.head;
    if (out.ellipsis)
      for (int64_t k = 0; k < ell_rank; ++k) spec.output.push_back(52 + static_cast<int>(k));
    spec.output.insert(spec.output.end(), out.tail.begin(), out.tail.end());
    std::set<int> seen;
    for (int l : spec.output) {
      if (!seen.insert(l).second) return user_error(node.where(), "equation '" + equation + "' repeats a label in its output");
      if (l < 52 && count[static_cast<size_t>(l)] == 0)
        return user_error(node.where(), "equation '" + equation + "' has an output label that no operand has");
    }
  } else {
    for (int64_t k = 0; k < ell_rank; ++k) spec.output.push_back(52 + static_cast<int>(k));
    for (int l = 0; l < 52; ++l)
      if (count[static_cast<size_t>(l)] == 1) spec.output.push_back(l);
  }
  return spec;
}

namespace {

Status infer_resize(InferContext& ctx) {
  const Shape& xs = ctx.shape(0);
  if (xs.rank() < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  std::string mode = ctx.node().attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return ctx.error("mode '" + mode + "' is not one of nearest, linear, cubic");
  std::string ctm = ctx.node().attr_string("coordinate_transformation_mode", "half_pixel");
  static const char* kModes[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                                 "tf_crop_and_resize"};
  if (std::none_of(std::begin(kModes), std::end(kModes), [&](const char* m) { return ctm == m; }))
    return ctx.error("coordinate_transformation_mode '" + ctm + "' is not supported");
  if (ctm == "tf_crop_and_resize" && !ctx.has_input(1)) return ctx.error("tf_crop_and_resize needs the roi input");
  std::string nm = ctx.node().attr_string("nearest_mode", "round_prefer_floor");
  if (nm != "round_prefer_floor" && nm != "round_prefer_ceil" && nm != "floor" && nm != "ceil")
    return ctx.error("nearest_mode '" + nm + "' is not one of round_prefer_floor, round_prefer_ceil, floor, ceil");
  std::vector<int64_t> in;
  for (const Dim& d : xs.dims) in.push_back(d.value);
  const Tensor* scales = ctx.value(2);
  const Tensor* sizes = ctx.value(3);
  bool scales_known = ctx.has_input(2) && scales && scales->numel() > 0;
  bool sizes_known = ctx.has_input(3) && sizes && sizes->numel() > 0;
  // An input given but unknown (not constant) leaves every resized dim unknown.
  bool unknown = (ctx.has_input(3) && !sizes) || (ctx.has_input(2) && !scales && !sizes_known);
  if (unknown || (!scales_known && !sizes_known)) {
    if (!unknown && !ctx.has_input(2) && !ctx.has_input(3)) return ctx.error("one of scales and sizes must be given");
    std::vector<Dim> out = xs.dims;
    std::vector<int64_t> axes = ctx.node().attr_ints("axes");
    for (size_t i = 0; i < out.size(); ++i)
      if (axes.empty() || std::count(axes.begin(), axes.end(), static_cast<int64_t>(i)) ||
          std::count(axes.begin(), axes.end(), static_cast<int64_t>(i) - xs.rank()))
        out[i] = Dim::unknown();
    ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
    return {};
  }
  KILN_ASSIGN_OR_RETURN(ResizeGeometry g, resolve_resize(ctx.node(), in, scales_known ? scales : nullptr, sizes_known ? sizes : nullptr));
  std::vector<Dim> out = xs.dims;
  for (int64_t a : g.axes) {
    size_t i = static_cast<size_t>(a);
    out[i] = g.out[i] >= 0 ? Dim::known(g.out[i]) : Dim::unknown();
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_einsum(InferContext& ctx) {
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) ranks.push_back(ctx.rank(i));
  if (!ctx.node().has_attr("equation")) return ctx.error("required attribute 'equation' is missing");
  if (std::any_of(ranks.begin(), ranks.end(), [](int64_t r) { return r < 0; })) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  KILN_ASSIGN_OR_RETURN(EinsumSpec spec, parse_einsum(ctx.node(), ctx.node().attr_string("equation", ""), ranks));
  std::vector<Dim> size(static_cast<size_t>(spec.num_labels), Dim::unknown());
  std::vector<bool> seen(size.size(), false);
  for (size_t i = 0; i < spec.inputs.size(); ++i)
    for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
      size_t l = static_cast<size_t>(spec.inputs[i][d]);
      const Dim& dim = ctx.shape(i).dims[d];
      if (!seen[l]) { size[l] = dim; seen[l] = true; continue; }
      if (size[l] == dim || (dim.is_known() && dim.value == 1)) continue;
      if (size[l].is_known() && size[l].value == 1) { size[l] = dim; continue; }
      if (size[l].is_known() && dim.is_known())
        return ctx.error("label size mismatch: " + std::to_string(size[l].value) + " and " + std::to_string(dim.value));
      if (!size[l].is_known()) size[l] = dim.is_known() ? dim : Dim::unknown();
    }
  std::vector<Dim> out;
  for (int l : spec.output) out.push_back(size[static_cast<size_t>(l)]);
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_grid_sample(InferContext& ctx) {
  std::string mode = ctx.node().attr_string("mode", "linear");
  if (mode != "linear" && mode != "nearest" && mode != "cubic") return ctx.error("mode '" + mode + "' is not one of linear, nearest, cubic");
  std::string pm = ctx.node().attr_string("padding_mode", "zeros");
  if (pm != "zeros" && pm != "border" && pm != "reflection")
    return ctx.error("padding_mode '" + pm + "' is not one of zeros, border, reflection");
  const Shape& xs = ctx.shape(0);
  const Shape& gs = ctx.shape(1);
  if (xs.rank() < 0 || gs.rank() < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  if (xs.rank() < 3 || gs.rank() != xs.rank())
    return ctx.error("X " + xs.str() + " and grid " + gs.str() + " must have the same rank, 3 or more");
  if (gs.dims.back().is_known() && gs.dims.back().value != xs.rank() - 2)
    return ctx.error("grid's last dim is " + std::to_string(gs.dims.back().value) + " but X has " + std::to_string(xs.rank() - 2) +
                     " spatial dims");
  if (mode == "cubic" && xs.rank() != 4) return ctx.error("cubic mode supports 2-D spatial inputs only");
  if (xs.dims[0].is_known() && gs.dims[0].is_known() && xs.dims[0].value != gs.dims[0].value)
    return ctx.error("grid has batch " + std::to_string(gs.dims[0].value) + " but X has " + std::to_string(xs.dims[0].value));
  std::vector<Dim> out{xs.dims[0], xs.dims[1]};
  for (size_t i = 1; i + 1 < gs.dims.size(); ++i) out.push_back(gs.dims[i]);
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_roi_align(InferContext& ctx) {
  std::string mode = ctx.node().attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") return ctx.error("mode '" + mode + "' is not one of avg, max");
  std::string ctm = ctx.node().attr_string("coordinate_transformation_mode", "half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    return ctx.error("coordinate_transformation_mode '" + ctm + "' is not one of half_pixel, output_half_pixel");
  const Shape& xs = ctx.shape(0);
  const Shape& rs = ctx.shape(1);
  if (xs.rank() >= 0 && xs.rank() != 4) return ctx.error("X must be 4-D, got " + xs.str());
  if (rs.rank() >= 0 && (rs.rank() != 2 || (rs.dims[1].is_known() && rs.dims[1].value != 4)))
    return ctx.error("rois must be [num_rois, 4], got " + rs.str());
  int64_t oh = ctx.node().attr_int("output_height", 1), ow = ctx.node().attr_int("output_width", 1);
  if (oh < 1 || ow < 1) return ctx.error("output_height and output_width must be at least 1");
  ctx.set_output(0, ctx.dtype(0),
                 Shape(std::vector<Dim>{rs.rank() == 2 ? rs.dims[0] : Dim::unknown(), xs.rank() == 4 ? xs.dims[1] : Dim::unknown(),
                                        Dim::known(oh), Dim::known(ow)}));
  return {};
}

Status infer_affine_grid(InferContext& ctx) {
  const Tensor* size = ctx.value(1);
  if (!size) {
    const Shape& ss = ctx.shape(1);
    if (ss.rank() == 1 && ss.dims[0].is_known())
      ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(static_cast<size_t>(ss.dims[0].value), Dim::unknown())));
    else
      ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  std::vector<int64_t> s = size->to_int64_vector();
  if (s.size() != 4 && s.size() != 5) return ctx.error("size must have 4 or 5 values, got " + std::to_string(s.size()));
  for (int64_t v : s)
    if (v < 0) return ctx.error("size has a negative value " + std::to_string(v));
  const int64_t nd = static_cast<int64_t>(s.size()) - 2;
  const Shape& ts = ctx.shape(0);
  if (ts.rank() >= 0 && (ts.rank() != 3 || (ts.dims[1].is_known() && ts.dims[1].value != nd) ||
                         (ts.dims[2].is_known() && ts.dims[2].value != nd + 1)))
    return ctx.error("theta must be [N, " + std::to_string(nd) + ", " + std::to_string(nd + 1) + "], got " + ts.str());
  std::vector<int64_t> out{s[0]};
  out.insert(out.end(), s.begin() + 2, s.end());
  out.push_back(nd);
  ctx.set_output(0, ctx.dtype(0), Shape::of(out));
  return {};
}

}  // namespace
}  // namespace nn

void register_nn_sample_ops(OpRegistry& r) {
  using namespace nn;
  using namespace types;
  r.add("", OpSchema{"Resize", "resize by scales or sizes: nearest, linear or cubic interpolation (opset 19 semantics)", 1, 4, 1, 1,
                     {{"antialias", AttrType::int64, false, "0"},
                      {"axes", AttrType::ints, false, "resized axes (all)"},
                      {"coordinate_transformation_mode", AttrType::string, false, "half_pixel"},
                      {"cubic_coeff_a", AttrType::float64, false, "-0.75"},
                      {"exclude_outside", AttrType::int64, false, "0"},
                      {"extrapolation_value", AttrType::float64, false, "0.0"},
                      {"keep_aspect_ratio_policy", AttrType::string, false, "stretch"},
                      {"mode", AttrType::string, false, "nearest"},
                      {"nearest_mode", AttrType::string, false, "round_prefer_floor"}},
                     infer_resize}).traits.types = {input(0, kNumeric)};
  r.add("", OpSchema{"Einsum", "Einstein summation over any equation", 1, kVariadic, 1, 1,
                     {{"equation", AttrType::string, true, "e.g. 'bij,bjk->bik'"}}, infer_einsum})
      .traits.types = {input(0, kNumeric), rest_same_as(1, 0)};
  r.add("", OpSchema{"GridSample", "sample X at grid locations (linear, nearest, cubic)", 2, 2, 1, 1,
                     {{"align_corners", AttrType::int64, false, "0"},
                      {"mode", AttrType::string, false, "linear"},
                      {"padding_mode", AttrType::string, false, "zeros"}},
                     infer_grid_sample}).traits.types = {input(0, kNumeric), input(1, kFloat, "grid")};
  r.add("", OpSchema{"RoiAlign", "pooled bilinear samples over regions of interest", 3, 3, 1, 1,
                     {{"coordinate_transformation_mode", AttrType::string, false, "half_pixel"},
                      {"mode", AttrType::string, false, "avg"},
                      {"output_height", AttrType::int64, false, "1"},
                      {"output_width", AttrType::int64, false, "1"},
                      {"sampling_ratio", AttrType::int64, false, "0 (adaptive)"},
                      {"spatial_scale", AttrType::float64, false, "1.0"}},
                     infer_roi_align})
      .traits.types = {input(0, kFloat, "X"), same_as(1, 0, "rois"), input(2, DType::i64, "batch_indices")};
  r.add("", OpSchema{"AffineGrid", "sampling grid from affine matrices", 2, 2, 1, 1,
                     {{"align_corners", AttrType::int64, false, "0"}}, infer_affine_grid})
      .traits.types = {input(0, kFloat, "theta"), input(1, DType::i64, "size")};
}

}  // namespace kiln
