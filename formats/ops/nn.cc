// Core ops of the nn family: Conv, ConvTranspose, MatMul, Gemm, the pools, LRN, MaxUnpool and
// Col2Im (schemas and type/shape inference). Resize, Einsum and the sampling ops live in
// formats/ops/nn_sample.cc. Semantics are those of the newest ONNX version of each op; see
// docs/ops/nn.md.
#include <algorithm>
#include <numeric>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/epilogue.h"
#include "formats/ops/flops.h"
#include "formats/ops/nn_util.h"
#include "formats/ops/shape_util.h"

namespace kiln {

void register_nn_sample_ops(OpRegistry& r);  // formats/ops/nn_sample.cc

namespace nn {

namespace {

std::string ints_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A window size computed from attributes and dims that does not fit in int64.
Error too_large(const Node& node, std::string_view what, size_t dim) {
  return user_error(node.where(), std::string(what) + " along spatial dim " + std::to_string(dim) + " overflows int64");
}

// Floor division for possibly negative numerators (ConvTranspose pads can be negative).
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0); }

// Reads an ints attribute that must hold `n` values (or be absent, giving `def` n times).
Result<std::vector<int64_t>> per_dim(const Node& node, std::string_view name, size_t n, int64_t def, int64_t min) {
  std::vector<int64_t> v = node.attr_ints(name);
  if (v.empty()) return std::vector<int64_t>(n, def);
  if (v.size() != n)
    return user_error(node.where(), std::string(name) + " has " + std::to_string(v.size()) + " values but the op has " +
                                        std::to_string(n) + " spatial dims");
  for (int64_t x : v)
    if (x < min) return user_error(node.where(), std::string(name) + " " + ints_str(v) + " has a value below " + std::to_string(min));
  return v;
}

Result<std::vector<int64_t>> read_pads(const Node& node, size_t n) {
  std::vector<int64_t> p = node.attr_ints("pads");
  if (p.empty()) return std::vector<int64_t>(2 * n, 0);
  if (p.size() != 2 * n)
    return user_error(node.where(), "pads has " + std::to_string(p.size()) + " values but " + std::to_string(2 * n) +
                                        " are needed for " + std::to_string(n) + " spatial dims");
  for (int64_t x : p)
    if (x < 0) return user_error(node.where(), "pads " + ints_str(p) + " has a negative value");
  return p;
}

}  // namespace

Result<Window> resolve_window(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel,
                              bool ceil_mode) {
  const size_t n = in.size();
  Window w;
  std::vector<int64_t> ks = node.attr_ints("kernel_shape");
  if (!ks.empty()) {
    if (!kernel.empty() && ks != kernel)
      return user_error(node.where(), "kernel_shape " + ints_str(ks) + " does not match the weight's " + ints_str(kernel));
    kernel = ks;
  }
  if (kernel.size() != n)
    return user_error(node.where(), "kernel_shape has " + std::to_string(kernel.size()) + " values but the input has " +
                                        std::to_string(n) + " spatial dims");
  for (int64_t k : kernel)
    if (k < 1) return user_error(node.where(), "kernel_shape " + ints_str(kernel) + " has a value below 1");
  w.kernel = kernel;
  KILN_ASSIGN_OR_RETURN(w.strides, per_dim(node, "strides", n, 1, 1));
  KILN_ASSIGN_OR_RETURN(w.dilations, per_dim(node, "dilations", n, 1, 1));
  KILN_ASSIGN_OR_RETURN(w.pads, read_pads(node, n));
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER")
    return user_error(node.where(), "auto_pad '" + auto_pad + "' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER");
  w.out.assign(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const CheckedInt checked_span = (CheckedInt(w.kernel[i]) - 1) * w.dilations[i] + 1;
    if (!checked_span.ok()) return too_large(node, "the window", i);
    const int64_t span = checked_span.value(), s = w.strides[i];
    if (auto_pad == "VALID") w.pads[i] = w.pads[n + i] = 0;
    if (in[i] < 0) continue;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      w.out[i] = in[i] / s + (in[i] % s != 0);
      CheckedInt total = (CheckedInt(w.out[i]) - 1) * s + span - in[i];
      if (!total.ok()) return too_large(node, "the padding", i);
      int64_t pad = std::max<int64_t>(0, total.value());
      int64_t small = pad / 2;
      w.pads[i] = auto_pad == "SAME_UPPER" ? small : pad - small;
      w.pads[n + i] = pad - w.pads[i];
      continue;
    }
    CheckedInt padded = CheckedInt(in[i]) + w.pads[i] + w.pads[n + i];
    if (!padded.ok()) return too_large(node, "the padded input", i);
    int64_t avail = padded.value() - span;
    if (avail < 0)
      return user_error(node.where(), "the window (" + std::to_string(span) + " with dilation) is larger than the padded input (" +
                                          std::to_string(padded.value()) + ") along spatial dim " + std::to_string(i));
    w.out[i] = (ceil_mode ? avail / s + (avail % s != 0) : avail / s) + 1;
    // With ceil_mode the last window must start inside the input or its begin padding.
    if (ceil_mode && (w.out[i] - 1) * s >= in[i] + w.pads[i]) --w.out[i];
  }
  return w;
}

Result<Window> resolve_transpose_window(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel) {
  const size_t n = in.size();
  std::vector<int64_t> unknown(n, -1);
  KILN_ASSIGN_OR_RETURN(Window w, resolve_window(node, unknown, std::move(kernel), false));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out_pad, per_dim(node, "output_padding", n, 0, 0));
  std::vector<int64_t> out_shape = node.attr_ints("output_shape");
  if (out_shape.size() > n) out_shape.erase(out_shape.begin(), out_shape.end() - static_cast<ptrdiff_t>(n));
  if (!out_shape.empty() && out_shape.size() != n)
    return user_error(node.where(), "output_shape " + ints_str(out_shape) + " does not have " + std::to_string(n) + " spatial dims");
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  for (size_t i = 0; i < n; ++i) {
    if (out_pad[i] >= std::max(w.strides[i], w.dilations[i]))
      return user_error(node.where(), "output_padding " + ints_str(out_pad) + " must be smaller than the stride or the dilation");
    if (in[i] < 0) continue;
    const CheckedInt span = (CheckedInt(w.kernel[i]) - 1) * w.dilations[i] + 1;
    const CheckedInt checked_full = CheckedInt(w.strides[i]) * (CheckedInt(in[i]) - 1) + out_pad[i] + span;
    if (!checked_full.ok()) return too_large(node, "the output", i);
    const int64_t full = checked_full.value();
    if (!out_shape.empty() || same) {
      // The pads follow from the requested output size: SAME_UPPER puts the smaller half first.
      CheckedInt target = !out_shape.empty() ? CheckedInt(out_shape[i]) : CheckedInt(in[i]) * w.strides[i];
      CheckedInt checked_total = CheckedInt(full) - target;
      if (!checked_total.ok()) return too_large(node, "the output", i);
      int64_t total = checked_total.value();
      int64_t half = floor_div(total, 2);
      w.pads[i] = auto_pad == "SAME_UPPER" ? half : total - half;
      w.pads[n + i] = total - w.pads[i];
      w.out[i] = target.value();
    } else {
      CheckedInt out = CheckedInt(full) - w.pads[i] - w.pads[n + i];
      if (!out.ok()) return too_large(node, "the output", i);
      w.out[i] = out.value();
    }
    if (w.out[i] < 0)
      return user_error(node.where(), "output size " + std::to_string(w.out[i]) + " along spatial dim " + std::to_string(i) + " is negative");
  }
  return w;
}

std::vector<int64_t> channels_last_perm(size_t rank) {
  std::vector<int64_t> p{0};
  for (size_t i = 2; i < rank; ++i) p.push_back(static_cast<int64_t>(i));
  if (rank > 1) p.push_back(1);
  return p;
}

std::vector<int64_t> channels_first_perm(size_t rank) {
  std::vector<int64_t> p{0};
  if (rank > 1) p.push_back(static_cast<int64_t>(rank - 1));
  for (size_t i = 1; i + 1 < rank; ++i) p.push_back(static_cast<int64_t>(i));
  return p;
}

namespace {

// The FusedConv view of one of PointwiseDepthwiseConv's stages: inputs `in` of the fused node
// (kNoValue where absent), channels_last, and the activation named by `prefix`_activation.
Node stage_view(const Node& fused, std::initializer_list<size_t> in, std::string_view prefix) {
  Node n;
  n.name = fused.name;
  n.op = "FusedConv";
  for (size_t i : in) n.inputs.push_back(i == SIZE_MAX || i >= fused.inputs.size() ? kNoValue : fused.inputs[i]);
  n.outputs = {kNoValue};
  const std::string act = std::string(prefix) + "activation", params = act + "_params";
  for (const Attribute& a : fused.attrs) {
    if (a.name == "channels_last") n.set_attr(a.name, a.value);
    else if (a.name == act) n.set_attr("activation", a.value);
    else if (a.name == params) n.set_attr("activation_params", a.value);
  }
  return n;
}

}  // namespace

Node pointwise_stage(const Node& fused) { return stage_view(fused, {0, 1, 2}, "pointwise_"); }

Node depthwise_stage(const Node& fused) {
  Node n = stage_view(fused, {SIZE_MAX, 3, 4}, "");
  for (const Attribute& a : fused.attrs)
    if (!a.name.starts_with("pointwise_") && !a.name.starts_with("projection_")) n.set_attr(a.name, a.value);
  return n;
}

Node projection_stage(const Node& fused) { return stage_view(fused, {SIZE_MAX, 5, 6, 7}, "projection_"); }

namespace {

// A node with channels_last = 1: `infer` runs on its channels-first view (X, and Z for
// FusedConv and QFusedConv: layout_input) and output 0 is permuted back.
Status infer_layout(InferContext& ctx, Status (*infer)(InferContext&)) {
  const int64_t last = ctx.node().attr_int("channels_last", 0);
  if (last == 0) return infer(ctx);
  if (last != 1) return ctx.error("channels_last " + std::to_string(last) + " must be 0 or 1");
  if (ctx.node().outputs.size() > 1 && ctx.node().outputs[1] != kNoValue)
    return ctx.error("a channels_last MaxPool has no Indices output");
  std::vector<InferInput> inputs(ctx.num_inputs());
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = {ctx.dtype(i), ctx.shape(i), ctx.fold_value(i)};
    if (layout_input(ctx.node(), i) && ctx.rank(i) >= 0) {
      if (ctx.rank(i) < 3) return ctx.error("a channels_last input must have rank 3 or more, got " + ctx.shape(i).str());
      inputs[i].shape.dims = permute(ctx.shape(i).dims, channels_first_perm(static_cast<size_t>(ctx.rank(i))));
      inputs[i].value = nullptr;
    }
  }
  InferContext first(ctx.node(), std::move(inputs));
  KILN_RETURN_IF_ERROR(infer(first));
  InferOutput& y = first.outputs()[0];
  if (y.shape.rank() >= 0) y.shape.dims = permute(y.shape.dims, channels_last_perm(static_cast<size_t>(y.shape.rank())));
  ctx.set_output(0, y.dtype, std::move(y.shape));
  return {};
}

std::vector<int64_t> dims_or_unknown(const Shape& s, size_t from) {
  std::vector<int64_t> v;
  for (size_t i = from; i < s.dims.size(); ++i) v.push_back(s.dims[i].value);
  return v;
}

Dim known_or(int64_t v) { return v >= 0 ? Dim::known(v) : Dim::unknown(); }

// Conv: X [N, C, D...], W [M, C/group, K...], B [M] -> Y [N, M, O...].
Status infer_conv(InferContext& ctx) {
  const int64_t group = ctx.node().attr_int("group", 1);
  if (group < 1) return ctx.error("group " + std::to_string(group) + " must be at least 1");
  if (ctx.has_input(2) && ctx.rank(2) >= 0 && ctx.rank(2) != 1)
    return ctx.error("bias must be 1-D, got shape " + ctx.shape(2).str());
  const Shape& xs = ctx.shape(0);
  const Shape& ws = ctx.shape(1);
  int64_t rank = xs.rank() >= 0 ? xs.rank() : ws.rank();
  if (rank < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  if (rank < 3) return ctx.error("X must have rank 3 or more (N, C, spatial...), got " + xs.str());
  if (ws.rank() >= 0 && ws.rank() != rank)
    return ctx.error("W has shape " + ws.str() + " but X has rank " + std::to_string(rank));
  Dim m = ws.rank() >= 0 ? ws.dims[0] : Dim::unknown();
  if (ws.rank() >= 0 && xs.rank() >= 0 && xs.dims[1].is_known() && ws.dims[1].is_known() &&
      CheckedInt(xs.dims[1].value) != CheckedInt(ws.dims[1].value) * group)
    return ctx.error("X has " + std::to_string(xs.dims[1].value) + " channels but W expects " +
                     std::to_string(ws.dims[1].value) + " x group " + std::to_string(group));
  if (m.is_known() && m.value % group != 0)
    return ctx.error("W has " + std::to_string(m.value) + " output channels, not a multiple of group " + std::to_string(group));
  if (ctx.has_input(2) && m.is_known() && ctx.rank(2) == 1 && ctx.shape(2).dims[0].is_known() &&
      ctx.shape(2).dims[0].value != m.value)
    return ctx.error("bias has " + std::to_string(ctx.shape(2).dims[0].value) + " elements but the conv has " +
                     std::to_string(m.value) + " output channels");
  std::vector<int64_t> in = xs.rank() >= 0 ? dims_or_unknown(xs, 2) : std::vector<int64_t>(static_cast<size_t>(rank - 2), -1);
  std::vector<int64_t> kernel;
  if (ws.rank() >= 0) {
    kernel = dims_or_unknown(ws, 2);
    if (std::any_of(kernel.begin(), kernel.end(), [](int64_t k) { return k < 0; })) kernel.clear();
  }
  std::vector<Dim> out{xs.rank() >= 0 ? xs.dims[0] : Dim::unknown(), m};
  if (kernel.empty() && !ctx.node().has_attr("kernel_shape")) {
    // The weight's spatial sizes are unknown, so are the output's.
    out.resize(static_cast<size_t>(rank), Dim::unknown());
    ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
    return {};
  }
  KILN_ASSIGN_OR_RETURN(Window w, resolve_window(ctx.node(), in, kernel, false));
  for (int64_t o : w.out) out.push_back(known_or(o));
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

// ConvTranspose: X [N, C, D...], W [C, M/group, K...] -> Y [N, M, O...].
Status infer_conv_transpose(InferContext& ctx) {
  const int64_t group = ctx.node().attr_int("group", 1);
  if (group < 1) return ctx.error("group " + std::to_string(group) + " must be at least 1");
  const Shape& xs = ctx.shape(0);
  const Shape& ws = ctx.shape(1);
  if (xs.rank() < 0 || ws.rank() < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  if (xs.rank() < 3) return ctx.error("X must have rank 3 or more (N, C, spatial...), got " + xs.str());
  if (ws.rank() != xs.rank()) return ctx.error("W has shape " + ws.str() + " but X has rank " + std::to_string(xs.rank()));
  if (xs.dims[1].is_known() && ws.dims[0].is_known() && xs.dims[1].value != ws.dims[0].value)
    return ctx.error("X has " + std::to_string(xs.dims[1].value) + " channels but W has " + std::to_string(ws.dims[0].value));
  if (xs.dims[1].is_known() && xs.dims[1].value % group != 0)
    return ctx.error("X has " + std::to_string(xs.dims[1].value) + " channels, not a multiple of group " + std::to_string(group));
  std::vector<int64_t> kernel = dims_or_unknown(ws, 2);
  if (std::any_of(kernel.begin(), kernel.end(), [](int64_t k) { return k < 0; })) {
    if (!ctx.node().has_attr("kernel_shape")) {
      std::vector<Dim> out{xs.dims[0], Dim::unknown()};
      out.resize(static_cast<size_t>(xs.rank()), Dim::unknown());
      ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
      return {};
    }
    kernel.clear();
  }
  KILN_ASSIGN_OR_RETURN(Window w, resolve_transpose_window(ctx.node(), dims_or_unknown(xs, 2), kernel));
  Dim channels = Dim::unknown();
  if (ws.dims[1].is_known()) {
    std::optional<int64_t> c = checked_mul(ws.dims[1].value, group);
    if (!c) return ctx.error("W's " + std::to_string(ws.dims[1].value) + " channels x group " + std::to_string(group) + " overflow int64");
    channels = Dim::known(*c);
  }
  std::vector<Dim> out{xs.dims[0], channels};
  for (int64_t o : w.out) out.push_back(known_or(o));
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_matmul(InferContext& ctx) {
  const Shape& a = ctx.shape(0);
  const Shape& b = ctx.shape(1);
  if (a.rank() < 0 || b.rank() < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  if (a.rank() == 0 || b.rank() == 0) return ctx.error("MatMul operands must have rank 1 or more, got " + a.str() + " and " + b.str());
  Shape a2 = a, b2 = b;
  if (a.rank() == 1) a2.dims.insert(a2.dims.begin(), Dim::known(1));
  if (b.rank() == 1) b2.dims.push_back(Dim::known(1));
  const Dim& ka = a2.dims.back();
  const Dim& kb = b2.dims[b2.dims.size() - 2];
  if (ka.is_known() && kb.is_known() && ka.value != kb.value)
    return ctx.error("cannot multiply " + a.str() + " by " + b.str() + ": inner dims " + std::to_string(ka.value) + " and " +
                     std::to_string(kb.value) + " differ");
  Shape ba(std::vector<Dim>(a2.dims.begin(), a2.dims.end() - 2));
  Shape bb(std::vector<Dim>(b2.dims.begin(), b2.dims.end() - 2));
  KILN_ASSIGN_OR_RETURN(Shape out, broadcast_shapes(ba, bb, ctx));
  if (a.rank() != 1) out.dims.push_back(a2.dims[a2.dims.size() - 2]);
  if (b.rank() != 1) out.dims.push_back(b2.dims.back());
  ctx.set_output(0, ctx.dtype(0), std::move(out));
  return {};
}

Status infer_gemm(InferContext& ctx) {
  const Shape& a = ctx.shape(0);
  const Shape& b = ctx.shape(1);
  if (a.rank() >= 0 && a.rank() != 2) return ctx.error("A must be 2-D, got " + a.str());
  if (b.rank() >= 0 && b.rank() != 2) return ctx.error("B must be 2-D, got " + b.str());
  const bool ta = ctx.node().attr_int("transA", 0) != 0, tb = ctx.node().attr_int("transB", 0) != 0;
  Dim m = a.rank() == 2 ? a.dims[ta ? 1 : 0] : Dim::unknown();
  Dim ka = a.rank() == 2 ? a.dims[ta ? 0 : 1] : Dim::unknown();
  Dim kb = b.rank() == 2 ? b.dims[tb ? 1 : 0] : Dim::unknown();
  Dim n = b.rank() == 2 ? b.dims[tb ? 0 : 1] : Dim::unknown();
  if (ka.is_known() && kb.is_known() && ka.value != kb.value)
    return ctx.error("cannot multiply A " + a.str() + " by B " + b.str() + " (transA " + std::to_string(ta) + ", transB " +
                     std::to_string(tb) + "): inner dims " + std::to_string(ka.value) + " and " + std::to_string(kb.value) + " differ");
  Shape y(std::vector<Dim>{m, n});
  if (ctx.has_input(2)) {
    const Shape& c = ctx.shape(2);
    if (c.rank() > 2) return ctx.error("C must have rank 2 or less, got " + c.str());
    // C broadcasts one way onto [M, N].
    for (int64_t i = 0; i < c.rank(); ++i) {
      const Dim& cd = c.dims[static_cast<size_t>(i)];
      const Dim& yd = y.dims[static_cast<size_t>(2 - c.rank() + i)];
      if (cd.is_known() && cd.value != 1 && yd.is_known() && cd.value != yd.value)
        return ctx.error("C " + c.str() + " cannot broadcast to the output " + y.str());
    }
  }
  ctx.set_output(0, ctx.dtype(0), std::move(y));
  return {};
}

// The epilogue of FusedConv / FusedMatMul (formats/ops/epilogue.h): the bias has one value per
// output channel (`channel_axis` of Y); Z, when given, has Y's shape.
Status infer_epilogue(InferContext& ctx, int64_t channel_axis) {
  KILN_RETURN_IF_ERROR(read_activation(ctx.node(), "activation").status());
  KILN_RETURN_IF_ERROR(read_activation(ctx.node(), "post_activation").status());
  if (ctx.outputs()[0].dtype == DType::undefined) return {};
  const Shape& y = ctx.outputs()[0].shape;
  if (ctx.has_input(2)) {
    const Shape& b = ctx.shape(2);
    if (b.rank() >= 0 && b.rank() != 1) return ctx.error("bias must be 1-D, got shape " + b.str());
    const int64_t axis = channel_axis < 0 ? y.rank() + channel_axis : channel_axis;
    if (b.rank() == 1 && y.rank() > axis && axis >= 0 && b.dims[0].is_known() && y.dims[static_cast<size_t>(axis)].is_known() &&
        b.dims[0].value != y.dims[static_cast<size_t>(axis)].value)
      return ctx.error("bias has " + std::to_string(b.dims[0].value) + " elements but the output " + y.str() + " has " +
                       std::to_string(y.dims[static_cast<size_t>(axis)].value) + " channels");
  }
  if (ctx.has_input(3)) {
    const Shape& z = ctx.shape(3);
    bool same = z.rank() < 0 || y.rank() < 0 || z.rank() == y.rank();
    for (size_t i = 0; same && z.rank() >= 0 && y.rank() >= 0 && i < z.dims.size(); ++i)
      same = !z.dims[i].is_known() || !y.dims[i].is_known() || z.dims[i].value == y.dims[i].value;
    if (!same) return ctx.error("the residual input Z " + z.str() + " does not have the output's shape " + y.str());
  }
  return {};
}

// FusedConv: Conv's shape; Y (and Z) of `output_type`, f32 unless it says bf16, which like a
// bf16 X needs a bf16 weight.
Status infer_fused_conv(InferContext& ctx) {
  const std::string out = ctx.node().attr_string("output_type", "f32");
  if (out != "f32" && out != "bf16") return ctx.error("output_type '" + out + "' is neither f32 nor bf16");
  const DType y = out == "bf16" ? DType::bf16 : DType::f32;
  if ((ctx.dtype(0) == DType::bf16 || y == DType::bf16) && ctx.dtype(1) != DType::bf16)
    return ctx.error("bf16 activations need a bf16 weight, not " + std::string(dtype_name(ctx.dtype(1))));
  if (ctx.has_input(3) && ctx.dtype(3) != DType::undefined && ctx.dtype(3) != y)
    return ctx.error("the residual input Z is " + std::string(dtype_name(ctx.dtype(3))) + " but output_type is " + out);
  KILN_RETURN_IF_ERROR(infer_conv(ctx));
  if (ctx.outputs()[0].dtype != DType::undefined) {
    Shape shape = ctx.outputs()[0].shape;
    ctx.set_output(0, y, std::move(shape));
  }
  return infer_epilogue(ctx, 1);
}

// Input i is present and a scalar (rank 0 or one element): a quantized op's scale or zero point.
Status scalar_input(const InferContext& ctx, size_t i, const char* what) {
  if (!ctx.has_input(i)) return ctx.error(std::string(what) + " is missing");
  const Shape& s = ctx.shape(i);
  if (s.rank() > 1 || (s.rank() == 1 && s.dims[0].is_known() && s.dims[0].value != 1))
    return ctx.error(std::string(what) + " has shape " + s.str() + "; it must be a scalar");
  return {};
}

// QFusedConv (channels-first view): its scales and zero points are scalars but for the
// weight's, per tensor or one per output channel; the shape is FusedConv's of the dequantized
// X, W, B and Z; Y takes y_zero_point's type.
Status infer_qfused_conv(InferContext& ctx) {
  auto scalar = [&](size_t i, const char* what) { return scalar_input(ctx, i, what); };
  KILN_RETURN_IF_ERROR(scalar(1, "x_scale"));
  KILN_RETURN_IF_ERROR(scalar(2, "x_zero_point"));
  KILN_RETURN_IF_ERROR(scalar(6, "y_scale"));
  KILN_RETURN_IF_ERROR(scalar(7, "y_zero_point"));
  if (ctx.has_input(9)) {
    KILN_RETURN_IF_ERROR(scalar(10, "z_scale"));
    KILN_RETURN_IF_ERROR(scalar(11, "z_zero_point"));
  }
  for (size_t i : {size_t{4}, size_t{5}}) {
    const Shape& s = ctx.shape(i);
    const Shape& w = ctx.shape(3);
    if (s.rank() > 1) return ctx.error(std::string(i == 4 ? "w_scale" : "w_zero_point") + " has shape " + s.str() + "; it must be a scalar or 1-D");
    if (s.rank() == 1 && s.dims[0].is_known() && s.dims[0].value != 1 && w.rank() >= 1 && w.dims[0].is_known() &&
        s.dims[0].value != w.dims[0].value)
      return ctx.error(std::string(i == 4 ? "w_scale" : "w_zero_point") + " has " + std::to_string(s.dims[0].value) +
                       " values but the weight " + w.str() + " has " + std::to_string(w.dims[0].value) + " output channels");
  }
  std::vector<InferInput> view(4);
  const size_t from[4] = {0, 3, 8, 9};
  for (size_t k = 0; k < 4; ++k)
    if (ctx.has_input(from[k])) view[k] = {DType::f32, ctx.shape(from[k]), nullptr};
  InferContext f(ctx.node(), std::move(view));
  KILN_RETURN_IF_ERROR(infer_fused_conv(f));
  ctx.set_output(0, ctx.dtype(7), std::move(f.outputs()[0].shape));
  return {};
}

// FusedMatMul: MatMul's shape and the epilogue; with `splits`, Y's columns go to that many
// outputs in order (a merged projection: Q, K and V from one product), each Y's shape with the
// last dim its part, and no Z; `activated` (one 0 or 1 per output) says which outputs the
// activations apply to (all of them without it). With `gate_block` G, the product's columns
// alternate G values and the G gates of those values (SwiGLU's up and gate projections): Y is
// half as wide, value · activation(gate), with no Z and no post-activation.
Status infer_gated_matmul(InferContext& ctx) {
  const Node& node = ctx.node();
  const int64_t g = node.attr_int("gate_block", 0);
  if (g <= 0) return ctx.error("gate_block " + std::to_string(g) + " is not positive");
  if (node.has_attr("splits") || node.has_attr("activated")) return ctx.error("gate_block with split outputs");
  if (ctx.num_outputs() != 1) return ctx.error(std::to_string(ctx.num_outputs()) + " outputs of a gated product; it has one");
  if (ctx.has_input(3)) return ctx.error("a residual input Z with gate_block");
  KILN_ASSIGN_OR_RETURN(ActivationSpec post, read_activation(node, "post_activation"));
  if (post.kind != Activation::none) return ctx.error("a post_activation with gate_block");
  KILN_RETURN_IF_ERROR(infer_epilogue(ctx, -1));  // the bias against the whole product
  if (ctx.outputs()[0].dtype == DType::undefined || ctx.outputs()[0].shape.rank() < 0) return {};
  Shape y = ctx.outputs()[0].shape;
  if (y.rank() == 0) return ctx.error("a gated scalar product");
  Dim& n = y.dims.back();
  if (n.is_known()) {
    if (n.value % (2 * g) != 0)
      return ctx.error("the product's " + std::to_string(n.value) + " columns are not whole blocks of " + std::to_string(g) +
                       " values and " + std::to_string(g) + " gates");
    n = Dim::known(n.value / 2);
  } else {
    n = Dim::unknown();
  }
  ctx.set_output(0, ctx.outputs()[0].dtype, std::move(y));
  return {};
}

Status infer_fused_matmul(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(infer_matmul(ctx));
  if (ctx.node().has_attr("gate_block")) return infer_gated_matmul(ctx);
  const std::vector<int64_t> splits = ctx.node().attr_ints("splits");
  if (splits.empty()) {
    if (ctx.num_outputs() != 1) return ctx.error(std::to_string(ctx.num_outputs()) + " outputs without splits; FusedMatMul has one");
    if (ctx.node().has_attr("activated")) return ctx.error("activated without splits");
    return infer_epilogue(ctx, -1);
  }
  if (splits.size() != ctx.num_outputs())
    return ctx.error(std::to_string(splits.size()) + " splits for " + std::to_string(ctx.num_outputs()) + " outputs");
  if (ctx.node().has_attr("activated")) {
    const std::vector<int64_t> on = ctx.node().attr_ints("activated");
    if (on.size() != splits.size())
      return ctx.error(std::to_string(on.size()) + " activated flags for " + std::to_string(splits.size()) + " outputs");
    for (int64_t f : on)
      if (f != 0 && f != 1) return ctx.error("activated flag " + std::to_string(f) + " is neither 0 nor 1");
  }
  if (ctx.has_input(3)) return ctx.error("a residual input Z with split outputs");
  int64_t total = 0;
  for (int64_t s : splits) {
    if (s <= 0) return ctx.error("split " + std::to_string(s) + " is not positive");
    std::optional<int64_t> sum = checked_add(total, s);
    if (!sum) return ctx.error("the splits overflow int64");
    total = *sum;
  }
  KILN_RETURN_IF_ERROR(infer_epilogue(ctx, -1));  // the bias against the whole of Y
  if (ctx.outputs()[0].dtype == DType::undefined) return {};
  const DType t = ctx.outputs()[0].dtype;
  const Shape y = ctx.outputs()[0].shape;
  if (y.rank() < 0) {
    for (size_t i = 0; i < splits.size(); ++i) ctx.set_output(i, t, Shape::unknown_rank());
    return {};
  }
  if (y.rank() == 0) return ctx.error("split outputs of a scalar product");
  const Dim& n = y.dims.back();
  if (n.is_known() && n.value != total)
    return ctx.error("the splits sum to " + std::to_string(total) + " but the product has " + std::to_string(n.value) + " columns");
  for (size_t i = 0; i < splits.size(); ++i) {
    Shape part = y;
    part.dims.back() = Dim::known(splits[i]);
    ctx.set_output(i, t, std::move(part));
  }
  return {};
}

// QFusedMatMul: A's, Y's and Z's scales and zero points are scalars, B's per tensor or one per
// output column; B is a 2-D [K, N] ([N, K] with transB); the shape is FusedMatMul's of the
// dequantized A, B, bias and Z (an f32 Z as it is); Y takes y_zero_point's type, or f32 without
// y's scale.
Status infer_qfused_matmul(InferContext& ctx) {
  auto scalar = [&](size_t i, const char* what) { return scalar_input(ctx, i, what); };
  KILN_RETURN_IF_ERROR(scalar(1, "a_scale"));
  KILN_RETURN_IF_ERROR(scalar(2, "a_zero_point"));
  if (ctx.has_input(6) || ctx.has_input(7)) {
    KILN_RETURN_IF_ERROR(scalar(6, "y_scale"));
    KILN_RETURN_IF_ERROR(scalar(7, "y_zero_point"));
  }
  if (ctx.has_input(9) && ctx.dtype(9) != DType::f32) {  // an f32 Z is read as it is
    KILN_RETURN_IF_ERROR(scalar(10, "z_scale"));
    KILN_RETURN_IF_ERROR(scalar(11, "z_zero_point"));
  }
  const int64_t trans = ctx.node().attr_int("transB", 0);
  if (trans != 0 && trans != 1) return ctx.error("transB " + std::to_string(trans) + " must be 0 or 1");
  Shape b = ctx.shape(3);
  if (b.rank() >= 0 && b.rank() != 2) return ctx.error("B has shape " + b.str() + "; it must be 2-D");
  if (b.rank() == 2 && trans) std::swap(b.dims[0], b.dims[1]);
  for (size_t i : {size_t{4}, size_t{5}}) {
    const Shape& s = ctx.shape(i);
    const char* what = i == 4 ? "b_scale" : "b_zero_point";
    if (s.rank() > 1) return ctx.error(std::string(what) + " has shape " + s.str() + "; it must be a scalar or 1-D");
    if (s.rank() == 1 && s.dims[0].is_known() && s.dims[0].value != 1 && b.rank() == 2 && b.dims[1].is_known() &&
        s.dims[0].value != b.dims[1].value)
      return ctx.error(std::string(what) + " has " + std::to_string(s.dims[0].value) + " values but B has " +
                       std::to_string(b.dims[1].value) + " output columns");
  }
  std::vector<InferInput> view(4);
  view[0] = {DType::f32, ctx.shape(0), nullptr};
  view[1] = {DType::f32, b, nullptr};
  if (ctx.has_input(8)) view[2] = {DType::f32, ctx.shape(8), nullptr};
  if (ctx.has_input(9)) view[3] = {DType::f32, ctx.shape(9), nullptr};
  InferContext f(ctx.node(), std::move(view));
  KILN_RETURN_IF_ERROR(infer_fused_matmul(f));
  const int64_t dq = ctx.node().attr_int("dequantize_output", 0);
  if (dq != 0 && dq != 1) return ctx.error("dequantize_output " + std::to_string(dq) + " must be 0 or 1");
  if (dq && (!ctx.has_input(6) || ctx.dtype(7) != DType::u8)) return ctx.error("dequantize_output needs y_scale and a u8 y_zero_point");
  ctx.set_output(0, ctx.has_input(6) && !dq ? ctx.dtype(7) : DType::f32, std::move(f.outputs()[0].shape));
  return {};
}

// WoqFusedMatMul: B a 2-D [K, N] ([N, K] with transB) of int8 or int4 codes, its scale (and
// zero point) per tensor, per output channel (`axis` B's N dim) or in blocks of `block_size`
// along K (`axis` B's K dim; the scale B's shape with K counted in blocks), as DequantizeLinear
// reads them; the output is FusedMatMul's on the dequantized B.
Status infer_woq_fused_matmul(InferContext& ctx) {
  const int64_t trans = ctx.node().attr_int("transB", 0);
  if (trans != 0 && trans != 1) return ctx.error("transB " + std::to_string(trans) + " must be 0 or 1");
  Shape b = ctx.shape(1);
  if (b.rank() >= 0 && b.rank() != 2) return ctx.error("B has shape " + b.str() + "; it must be 2-D");
  const int64_t block = ctx.node().attr_int("block_size", 0);
  if (block < 0) return ctx.error("block_size " + std::to_string(block) + " is negative");
  int64_t axis = ctx.node().attr_int("axis", 1);
  if (axis < 0) axis += 2;
  const int64_t k_axis = trans ? 1 : 0;
  for (size_t i : {size_t{2}, size_t{3}}) {
    if (!ctx.has_input(i)) continue;
    const Shape& s = ctx.shape(i);
    const char* what = i == 2 ? "b_scale" : "b_zero_point";
    if (s.rank() < 0) continue;
    if (block > 0) {
      if (axis != k_axis) return ctx.error("blocked: axis " + std::to_string(axis) + " must be B's K dim " + std::to_string(k_axis));
      if (s.rank() != 2) return ctx.error(std::string(what) + " has shape " + s.str() + "; blocked, it must be 2-D as B");
      if (b.rank() == 2) {
        const Dim& kd = b.dims[static_cast<size_t>(k_axis)];
        const Dim& nd = b.dims[static_cast<size_t>(1 - k_axis)];
        const Dim& sk = s.dims[static_cast<size_t>(k_axis)];
        const Dim& sn = s.dims[static_cast<size_t>(1 - k_axis)];
        if ((kd.is_known() && sk.is_known() && sk.value != (kd.value + block - 1) / block) ||
            (nd.is_known() && sn.is_known() && sn.value != nd.value))
          return ctx.error(std::string(what) + " has shape " + s.str() + " but B " + b.str() + " in blocks of " +
                           std::to_string(block) + " along K needs one per block and output column");
      }
    } else if (s.rank() > 1) {
      return ctx.error(std::string(what) + " has shape " + s.str() + "; it must be a scalar or 1-D (or blocked)");
    } else if (s.rank() == 1 && s.dims[0].is_known() && s.dims[0].value != 1) {
      if (axis != 1 - k_axis) return ctx.error("per channel: axis " + std::to_string(axis) + " must be B's N dim " + std::to_string(1 - k_axis));
      const Dim& nd = b.rank() == 2 ? b.dims[static_cast<size_t>(1 - k_axis)] : Dim{};
      if (nd.is_known() && s.dims[0].value != nd.value)
        return ctx.error(std::string(what) + " has " + std::to_string(s.dims[0].value) + " values but B has " +
                         std::to_string(nd.value) + " output columns");
    }
  }
  if (b.rank() == 2 && trans) std::swap(b.dims[0], b.dims[1]);
  std::vector<InferInput> view(4);
  view[0] = {DType::f32, ctx.shape(0), nullptr};
  view[1] = {DType::f32, b, nullptr};
  if (ctx.has_input(4)) view[2] = {DType::f32, ctx.shape(4), nullptr};
  if (ctx.has_input(5)) view[3] = {DType::f32, ctx.shape(5), nullptr};
  InferContext f(ctx.node(), std::move(view));
  KILN_RETURN_IF_ERROR(infer_fused_matmul(f));
  ctx.set_output(0, DType::f32, std::move(f.outputs()[0].shape));
  return {};
}

// Shared by MaxPool, AveragePool, LpPool.
Status infer_pool(InferContext& ctx) {
  DType t = ctx.dtype(0);
  const Shape& xs = ctx.shape(0);
  if (xs.rank() < 0) {
    ctx.set_output(0, t, Shape::unknown_rank());
    ctx.set_output(1, DType::i64, Shape::unknown_rank());
    return {};
  }
  if (xs.rank() < 3) return ctx.error("X must have rank 3 or more (N, C, spatial...), got " + xs.str());
  if (!ctx.node().has_attr("kernel_shape")) return ctx.error("required attribute 'kernel_shape' is missing");
  KILN_ASSIGN_OR_RETURN(Window w, resolve_window(ctx.node(), dims_or_unknown(xs, 2), {}, ctx.node().attr_int("ceil_mode", 0) != 0));
  std::vector<Dim> out{xs.dims[0], xs.dims[1]};
  for (int64_t o : w.out) out.push_back(known_or(o));
  ctx.set_output(0, t, Shape(out));
  ctx.set_output(1, DType::i64, Shape(std::move(out)));
  return {};
}

Status infer_maxpool(InferContext& ctx) {
  int64_t so = ctx.node().attr_int("storage_order", 0);
  if (so != 0 && so != 1) return ctx.error("storage_order " + std::to_string(so) + " must be 0 or 1");
  return infer_pool(ctx);
}

Status infer_global_pool(InferContext& ctx) {
  const Shape& xs = ctx.shape(0);
  if (xs.rank() < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  if (xs.rank() < 2) return ctx.error("X must have rank 2 or more (N, C, spatial...), got " + xs.str());
  std::vector<Dim> out = xs.dims;
  for (size_t i = 2; i < out.size(); ++i) out[i] = Dim::known(1);
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_lrn(InferContext& ctx) {
  if (ctx.node().attr_int("size", 0) < 1) return ctx.error("size must be at least 1");
  if (ctx.rank(0) >= 0 && ctx.rank(0) < 2) return ctx.error("X must have rank 2 or more, got " + ctx.shape(0).str());
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

// MaxUnpool: X [N, C, D...], I (i64, same shape), output_shape? -> Y.
Status infer_max_unpool(InferContext& ctx) {
  const Shape& xs = ctx.shape(0);
  if (xs.rank() < 0) {
    ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    return {};
  }
  if (xs.rank() < 3) return ctx.error("X must have rank 3 or more (N, C, spatial...), got " + xs.str());
  const size_t n = static_cast<size_t>(xs.rank() - 2);
  if (ctx.has_input(2)) {
    if (const Tensor* os = ctx.value(2)) {
      std::vector<int64_t> v = os->to_int64_vector();
      if (v.size() != static_cast<size_t>(xs.rank()))
        return ctx.error("output_shape has " + std::to_string(v.size()) + " values but X has rank " + std::to_string(xs.rank()));
      for (int64_t d : v)
        if (d < 0) return ctx.error("output_shape " + ints_str(v) + " has a negative dim");
      ctx.set_output(0, ctx.dtype(0), Shape::of(v));
    } else {
      ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(static_cast<size_t>(xs.rank()), Dim::unknown())));
    }
    return {};
  }
  std::vector<int64_t> k = ctx.node().attr_ints("kernel_shape");
  if (k.size() != n) return ctx.error("kernel_shape must have " + std::to_string(n) + " values");
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> s, per_dim(ctx.node(), "strides", n, 1, 1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> p, read_pads(ctx.node(), n));
  std::vector<Dim> out{xs.dims[0], xs.dims[1]};
  for (size_t i = 0; i < n; ++i) {
    const Dim& d = xs.dims[2 + i];
    if (!d.is_known()) {
      out.push_back(Dim::unknown());
      continue;
    }
    CheckedInt o = (CheckedInt(d.value) - 1) * s[i] + k[i] - p[i] - p[n + i];
    if (!o.ok()) return too_large(ctx.node(), "the output", i);
    if (o.value() < 0) return ctx.error("the output size along spatial dim " + std::to_string(i) + " is negative (" + std::to_string(o.value()) + ")");
    out.push_back(Dim::known(o.value()));
  }
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

// Col2Im: input [N, C*prod(block), L], image_shape, block_shape -> [N, C, image...].
Status infer_col2im(InferContext& ctx) {
  const Shape& xs = ctx.shape(0);
  if (xs.rank() >= 0 && xs.rank() != 3) return ctx.error("input must be 3-D [N, C*prod(block_shape), L], got " + xs.str());
  const Tensor* img = ctx.value(1);
  const Tensor* blk = ctx.value(2);
  if (!img || !blk) {
    int64_t n = ctx.shape(1).rank() == 1 && ctx.shape(1).dims[0].is_known() ? ctx.shape(1).dims[0].value : -1;
    if (n < 0 || n > kMaxRank) ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank());
    else ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(static_cast<size_t>(n + 2), Dim::unknown())));
    return {};
  }
  std::vector<int64_t> image = img->to_int64_vector(), block = blk->to_int64_vector();
  if (image.size() != block.size() || image.empty())
    return ctx.error("image_shape has " + std::to_string(image.size()) + " values but block_shape has " + std::to_string(block.size()));
  CheckedInt checked_bprod = 1;
  for (int64_t b : block) {
    if (b < 1) return ctx.error("block_shape " + ints_str(block) + " has a value below 1");
    checked_bprod *= b;
  }
  if (!checked_bprod.ok()) return ctx.error("block_shape " + ints_str(block) + " multiplies past the int64 range");
  for (int64_t v : image)
    if (v < 0) return ctx.error("image_shape " + ints_str(image) + " has a negative dim");
  const int64_t bprod = checked_bprod.value();
  Dim c = Dim::unknown(), nb = Dim::unknown();
  if (xs.rank() == 3) {
    nb = xs.dims[0];
    if (xs.dims[1].is_known()) {
      if (xs.dims[1].value % bprod != 0)
        return ctx.error("input dim 1 (" + std::to_string(xs.dims[1].value) + ") is not a multiple of prod(block_shape) " + std::to_string(bprod));
      c = Dim::known(xs.dims[1].value / bprod);
    }
  }
  std::vector<Dim> out{nb, c};
  for (int64_t v : image) out.push_back(Dim::known(v));
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

const AttrSpec kAutoPad{"auto_pad", AttrType::string, false, "NOTSET, VALID, SAME_UPPER or SAME_LOWER"};
const AttrSpec kDilations{"dilations", AttrType::ints, false, "per spatial dim, default 1"};
const AttrSpec kKernelShape{"kernel_shape", AttrType::ints, false, "window size per spatial dim"};
const AttrSpec kPads{"pads", AttrType::ints, false, "begins then ends, default 0"};
const AttrSpec kStrides{"strides", AttrType::ints, false, "per spatial dim, default 1"};
const AttrSpec kCeilMode{"ceil_mode", AttrType::int64, false, "round output size up (0)"};
const AttrSpec kChannelsLast{"channels_last", AttrType::int64, false,
                             "1: X (and Z) and Y are [N, spatial..., C] (0: [N, C, spatial...]); set by kiln compile"};

Status infer_fused_conv_any_layout(InferContext& ctx) { return infer_layout(ctx, infer_fused_conv); }

// FusedConv with `x_parts` P: X is the concatenation along the channels of input 0 and the P - 1
// inputs after Z (compile's fuse_concat: a pointwise convolution reading a Concat's inputs where
// they lie). Each part has X's rank and its dims off the channel axis; the shape is FusedConv's
// of the joined X.
Status infer_fused_conv_parts(InferContext& ctx) {
  if (const int64_t first = ctx.node().attr_int("x_channels_first", 0); first != 0) {
    if (first != 1) return ctx.error("x_channels_first " + std::to_string(first) + " must be 0 or 1");
    if (ctx.node().attr_int("channels_last", 0) != 1) return ctx.error("x_channels_first needs channels_last = 1");
    if (ctx.node().has_attr("x_parts")) return ctx.error("x_channels_first with X in parts");
  }
  if (const int64_t codes = ctx.node().attr_int("int8_operands", 0); codes != 0 && codes != 1)
    return ctx.error("int8_operands " + std::to_string(codes) + " must be 0 or 1");
  const size_t extra = ctx.num_inputs() > 4 ? ctx.num_inputs() - 4 : 0;
  if (!ctx.node().has_attr("x_parts")) {
    if (extra) return ctx.error("inputs after Z need x_parts");
    return infer_fused_conv_any_layout(ctx);
  }
  const int64_t parts = ctx.node().attr_int("x_parts", 0);
  if (parts < 2 || static_cast<size_t>(parts - 1) != extra)
    return ctx.error("x_parts is " + std::to_string(parts) + " but the node has " + std::to_string(extra + 1) + " parts of X");
  std::vector<size_t> at = {0};
  for (size_t i = 4; i < ctx.num_inputs(); ++i) at.push_back(i);
  for (size_t k = 0; k < at.size(); ++k)
    if (!ctx.has_input(at[k])) return ctx.error("part " + std::to_string(k) + " of X is missing");
  std::vector<InferInput> view(4);
  for (size_t i = 1; i < 4; ++i)
    if (ctx.has_input(i)) view[i] = {ctx.dtype(i), ctx.shape(i), ctx.fold_value(i)};
  view[0] = {ctx.dtype(0), Shape(), nullptr};
  if (std::all_of(at.begin(), at.end(), [&](size_t i) { return ctx.rank(i) >= 0; })) {
    const int64_t rank = ctx.rank(0);
    if (rank < 3) return ctx.error("X has rank " + std::to_string(rank) + "; a convolution's is 3 or more");
    const size_t axis = ctx.node().attr_int("channels_last", 0) == 1 ? static_cast<size_t>(rank - 1) : 1;
    std::vector<Dim> dims = ctx.shape(0).dims;
    for (size_t k = 1; k < at.size(); ++k) {
      const Shape& s = ctx.shape(at[k]);
      if (s.rank() != rank)
        return ctx.error("part " + std::to_string(k) + " of X has rank " + std::to_string(s.rank()) + " but part 0 has " + std::to_string(rank));
      for (size_t d = 0; d < dims.size(); ++d) {
        if (d == axis) {
          KILN_ASSIGN_OR_RETURN(dims[d], shape_ops::dim_add(dims[d], s.dims[d], ctx));
        } else if (s.dims[d].is_known() && dims[d].is_known() && s.dims[d].value != dims[d].value) {
          return ctx.error("part " + std::to_string(k) + " of X has shape " + s.str() + ", which differs from part 0's " +
                           ctx.shape(0).str() + " off the channel axis");
        } else if (!dims[d].is_known()) {
          dims[d] = s.dims[d];
        }
      }
    }
    view[0].shape = Shape(std::move(dims));
  }
  InferContext joined(ctx.node(), std::move(view));
  KILN_RETURN_IF_ERROR(infer_fused_conv_any_layout(joined));
  ctx.set_output(0, joined.outputs()[0].dtype, std::move(joined.outputs()[0].shape));
  return {};
}
Status infer_qfused_conv_any_layout(InferContext& ctx) { return infer_layout(ctx, infer_qfused_conv); }

// PointwiseDepthwiseConv: f32, the weights f32 or f16; its pointwise stage FusedConv's shape
// from X (W1 [Cm, C, 1, 1]), or X's without W1, then its depthwise stage's from that (W2 [Cm,
// 1, KH, KW], group Cm), then with W3 its projection stage's from that (W3 [Co, Cm, 1, 1], Z
// Y's shape).
Status infer_pointwise_depthwise_conv(InferContext& ctx) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const bool weight = i == 1 || i == 3 || i == 5;
    if (ctx.has_input(i) && ctx.dtype(i) != DType::f32 && !(weight && ctx.dtype(i) == DType::f16))
      return ctx.error("input " + std::to_string(i) + " is " + std::string(dtype_name(ctx.dtype(i))) + "; the op is f32 only" +
                       (weight ? ", its weights f32 or f16" : ""));
  }
  if (!ctx.has_input(3)) return ctx.error("W2 is required");
  if (!ctx.has_input(1) && ctx.has_input(2)) return ctx.error("B1 without W1");
  if (!ctx.has_input(5) && (ctx.has_input(6) || ctx.has_input(7))) return ctx.error("B3 or Z without W3");
  if (!ctx.has_input(1) && !ctx.has_input(5)) return ctx.error("W1 or W3 is required: a depthwise convolution alone is a FusedConv");
  auto known = [](const Shape& s, size_t d, int64_t v) {
    return s.rank() <= static_cast<int64_t>(d) || !s.dims[d].is_known() || s.dims[d].value == v;
  };
  auto pointwise_weight = [&](size_t i, const char* what) -> Status {
    const Shape& w = ctx.shape(i);
    if (ctx.has_input(i) && w.rank() >= 0 && (w.rank() != 4 || !known(w, 2, 1) || !known(w, 3, 1)))
      return ctx.error(std::string(what) + " " + w.str() + " is not a 1x1 convolution's weight");
    return {};
  };
  KILN_RETURN_IF_ERROR(pointwise_weight(1, "W1"));
  KILN_RETURN_IF_ERROR(pointwise_weight(5, "W3"));
  const Shape& w2 = ctx.shape(3);
  if (w2.rank() >= 0 && (w2.rank() != 4 || !known(w2, 1, 1)))
    return ctx.error("W2 " + w2.str() + " is not a depthwise convolution's weight [Cm, 1, KH, KW]");
  if (ctx.has_input(1)) {
    const Shape& w1 = ctx.shape(1);
    if (w1.rank() == 4 && w2.rank() == 4 && w1.dims[0].is_known() && w2.dims[0].is_known() && w1.dims[0].value != w2.dims[0].value)
      return ctx.error("W1 " + w1.str() + " and W2 " + w2.str() + " differ in their channels");
  }
  const int64_t group = ctx.node().attr_int("group", 1);
  if (w2.rank() == 4 && w2.dims[0].is_known() && group != w2.dims[0].value)
    return ctx.error("group " + std::to_string(group) + " is not W2's " + std::to_string(w2.dims[0].value) + " channels");
  // The output of one stage's FusedConv view over its input `x` and the node's inputs `from`.
  auto stage = [&](const Node& view, InferInput x, std::initializer_list<size_t> from) -> Result<InferOutput> {
    std::vector<InferInput> in{std::move(x)};
    for (size_t i : from) in.push_back(ctx.has_input(i) ? InferInput{ctx.dtype(i), ctx.shape(i), ctx.fold_value(i)} : InferInput{});
    InferContext c(view, std::move(in));
    KILN_RETURN_IF_ERROR(infer_fused_conv_any_layout(c));
    return c.outputs()[0];
  };
  InferInput t{ctx.dtype(0), ctx.shape(0), nullptr};
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(InferOutput out, stage(pointwise_stage(ctx.node()), {ctx.dtype(0), ctx.shape(0), ctx.fold_value(0)}, {1, 2}));
    t = {out.dtype, std::move(out.shape), nullptr};
  }
  KILN_ASSIGN_OR_RETURN(InferOutput y, stage(depthwise_stage(ctx.node()), std::move(t), {3, 4}));
  if (ctx.has_input(5)) {
    KILN_ASSIGN_OR_RETURN(y, stage(projection_stage(ctx.node()), {y.dtype, std::move(y.shape), nullptr}, {5, 6, 7}));
  }
  ctx.set_output(0, y.dtype, std::move(y.shape));
  return {};
}
Status infer_maxpool_any_layout(InferContext& ctx) { return infer_layout(ctx, infer_maxpool); }
Status infer_pool_any_layout(InferContext& ctx) { return infer_layout(ctx, infer_pool); }
Status infer_global_pool_any_layout(InferContext& ctx) { return infer_layout(ctx, infer_global_pool); }

// QGlobalAveragePool: GlobalAveragePool of dequantized u8/s8 x, quantized with y's scale and
// zero point (scalars); y takes y_zero_point's type.
Status infer_qglobal_average_pool(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalar_inputs(ctx, {1, 2, 3, 4}));
  KILN_RETURN_IF_ERROR(infer_layout(ctx, infer_global_pool));
  ctx.outputs()[0].dtype = ctx.dtype(4);
  return {};
}

}  // namespace
}  // namespace nn

void register_nn_ops(OpRegistry& r) {
  using namespace nn;
  using namespace types;
  const std::vector<TypeConstraint> conv_types = {input(0, kFloat, "X"), same_as(1, 0, "W"), same_as(2, 0, "B")};
  const TypeSet matmul_types = kFloat | DType::i32 | DType::i64 | DType::u32 | DType::u64;
  r.add("", OpSchema{"Conv", "N-d convolution with groups, strides, dilations, pads and optional bias", 2, 3, 1, 1,
                     {kAutoPad, kDilations, {"group", AttrType::int64, false, "channel groups (1)"}, kKernelShape, kPads, kStrides},
                     infer_conv}).traits = {.types = conv_types, .flops = flops::conv<1>, .prepack_inputs = {1}};
  r.add("", OpSchema{"ConvTranspose", "N-d transposed convolution (gradient of Conv)", 2, 3, 1, 1,
                     {kAutoPad, kDilations, {"group", AttrType::int64, false, "channel groups (1)"}, kKernelShape,
                      {"output_padding", AttrType::ints, false, "extra size at the end of each dim"},
                      {"output_shape", AttrType::ints, false, "requested output spatial size"}, kPads, kStrides},
                     infer_conv_transpose})
      .traits = {.types = conv_types, .flops = flops::conv_transpose, .prepack_inputs = {1}};
  r.add("", OpSchema{"MatMul", "numpy matmul: batched, broadcasting, 1-D operands promoted", 2, 2, 1, 1, {}, infer_matmul})
      .traits = {.types = {input(0, matmul_types), same_as(1, 0)}, .flops = flops::matmul<0>, .prepack_inputs = {1}};
  r.add("", OpSchema{"Gemm", "alpha * op(A) @ op(B) + beta * C, C broadcast to [M, N]", 2, 3, 1, 1,
                     {{"alpha", AttrType::float64, false, "1.0"}, {"beta", AttrType::float64, false, "1.0"},
                      {"transA", AttrType::int64, false, "0"}, {"transB", AttrType::int64, false, "0"}},
                     infer_gemm})
      .traits = {.types = {input(0, matmul_types), same_as(1, 0), same_as(2, 0)}, .flops = flops::gemm, .prepack_inputs = {1}};
  // What `kiln compile` fuses a convolution or matrix product and its epilogue into.
  const std::vector<AttrSpec> epilogue = {
      {"activation", AttrType::string, false, "applied after the bias (none)"},
      {"activation_params", AttrType::floats, false, "its alpha / min and beta / max"},
      {"post_activation", AttrType::string, false, "applied after adding Z (none)"},
      {"post_activation_params", AttrType::floats, false, "its alpha / min and beta / max"}};
  std::vector<AttrSpec> fused_conv = {kAutoPad, kDilations, {"group", AttrType::int64, false, "channel groups (1)"},
                                      kKernelShape, kPads, kStrides};
  fused_conv.insert(fused_conv.end(), epilogue.begin(), epilogue.end());
  fused_conv.push_back(kChannelsLast);
  // A bf16 or f16 weight (`kiln compile --precision`): the products of X rounded to its type,
  // summed in f32. With a bf16 weight, X may be bf16 too, and Y and Z are bf16 with
  // `output_type` bf16 (activations kept bf16 from one convolution to the next: Y rounded as it
  // is stored); the bias and the epilogue are f32.
  const TypeSet lowp_weight = DType::f32 | DType::bf16 | DType::f16;
  std::vector<AttrSpec> fused_conv_only = fused_conv;
  fused_conv_only.push_back({"output_type", AttrType::string, false, "Y's and Z's type: f32 (default), or bf16 with a bf16 W"});
  fused_conv_only.push_back({"x_parts", AttrType::int64, false, "X in this many parts along the channels: input 0, then the inputs after Z"});
  fused_conv_only.push_back({"x_channels_first", AttrType::int64, false,
                             "1: X is [N, C, spatial...] though channels_last = 1 makes Z and Y [N, spatial..., C] (0)"});
  fused_conv_only.push_back({"int8_operands", AttrType::int64, false,
                             "1: X and W are dequantized int8 codes that compile left f32 (no int8 products on the target, or a form "
                             "its int8 kernels lack): the sums stay direct, no Winograd (0)"});
  r.add("", OpSchema{"FusedConv", "Conv + bias + activation + residual Z + activation, in one (f32; W may be bf16 or f16, X, Z and Y bf16 with a bf16 W)", 2, kVariadic, 1, 1,
                     fused_conv_only, infer_fused_conv_parts})
      .traits = {.types = {input(0, DType::f32 | DType::bf16), input(1, lowp_weight, "W"), input(2, DType::f32, "B"), input(3, DType::f32 | DType::bf16, "Z"),
                           rest_same_as(4, 0)},
                 .prepack_inputs = {1}};  // flops: the conv's plus its epilogue's (flop_models.cc)
  {
    std::vector<AttrSpec> attrs = {kAutoPad, kDilations, {"group", AttrType::int64, false, "the depthwise stage's groups: Cm"},
                                   kKernelShape, kPads, kStrides, epilogue[0], epilogue[1], kChannelsLast,
                                   {"pointwise_activation", AttrType::string, false, "applied after the pointwise stage's bias (none)"},
                                   {"pointwise_activation_params", AttrType::floats, false, "its alpha / min and beta / max"},
                                   {"projection_activation", AttrType::string, false, "applied after the projection stage's bias, before Z (none)"},
                                   {"projection_activation_params", AttrType::floats, false, "its alpha / min and beta / max"}};
    r.add("", OpSchema{"PointwiseDepthwiseConv",
                       "FusedConv 1x1 (W1, B1, pointwise_activation), then a depthwise FusedConv of its output (W2, B2, window, activation), "
                       "then FusedConv 1x1 of that (W3, B3, projection_activation, residual Z); the first or last stage may be absent; "
                       "the intermediates never stored whole (f32; a weight may be f16, each stage's products then of its input as it "
                       "is, as FusedConv's)",
                       1, 8, 1, 1, std::move(attrs), infer_pointwise_depthwise_conv})  // W1, B1 may be omitted; W2 is checked
        .traits = {.types = {input(0, DType::f32), input(1, DType::f32 | DType::f16, "W1"), same_as(2, 0, "B1"),
                             input(3, DType::f32 | DType::f16, "W2"), same_as(4, 0, "B2"), input(5, DType::f32 | DType::f16, "W3"),
                             same_as(6, 0, "B3"), same_as(7, 0, "Z")}};
  }
  {
    const TypeSet int8 = DType::u8 | DType::i8;
    r.add("", OpSchema{"QFusedConv", "FusedConv on dequantized u8/s8 X, W and Z, its output quantized (int8 kernels)", 8, 12, 1, 1,
                       fused_conv, infer_qfused_conv_any_layout})
        .traits = {.types = {input(0, int8, "x"), input(1, DType::f32, "x_scale"), same_as(2, 0, "x_zero_point"),
                             input(3, DType::i8, "w"), same_as(4, 1, "w_scale"), same_as(5, 3, "w_zero_point"),
                             same_as(6, 1, "y_scale"), input(7, int8, "y_zero_point"), same_as(8, 1, "B"),
                             input(9, int8, "z"), same_as(10, 1, "z_scale"), same_as(11, 9, "z_zero_point")},
                   .prepack_inputs = {3}};
    std::vector<AttrSpec> qmatmul = epilogue;
    qmatmul.push_back({"transB", AttrType::int64, false, "1: B is [N, K] (0)"});
    qmatmul.push_back({"dequantize_output", AttrType::int64, false,
                       "1: Y is f32, the quantized result dequantized again (a u8 Q -> DQ pair taken in) (0)"});
    r.add("", OpSchema{"QFusedMatMul", "FusedMatMul on dequantized u8/s8 A, s8 B and Z, its output quantized or f32 (int8 kernels)", 6,
                       12, 1, 1, qmatmul, infer_qfused_matmul})
        .traits = {.types = {input(0, int8, "a"), input(1, DType::f32, "a_scale"), same_as(2, 0, "a_zero_point"),
                             input(3, DType::i8, "b"), same_as(4, 1, "b_scale"), same_as(5, 3, "b_zero_point"),
                             same_as(6, 1, "y_scale"), input(7, int8, "y_zero_point"), same_as(8, 1, "bias"),
                             input(9, int8 | DType::f32, "z"), same_as(10, 1, "z_scale"), input(11, int8, "z_zero_point")},
                   .prepack_inputs = {3}};
    // flops: the conv's / matmul's plus the epilogue's (flop_models.cc)
    std::vector<AttrSpec> woq = epilogue;
    woq.push_back({"transB", AttrType::int64, false, "1: B is [N, K] (0)"});
    woq.push_back({"axis", AttrType::int64, false, "B's dim the scales follow, as DequantizeLinear's (1)"});
    woq.push_back({"block_size", AttrType::int64, false, "K values per scale along axis; 0 = per channel or per tensor"});
    r.add("", OpSchema{"WoqFusedMatMul", "FusedMatMul of f32 A by a weight stored as int8 / int4 codes (weight-only quantization)",
                       3, 6, 1, 1, woq, infer_woq_fused_matmul})
        .traits = {.types = {input(0, DType::f32, "a"), input(1, int8 | DType::i4 | DType::u4, "b"), same_as(2, 0, "b_scale"),
                             same_as(3, 1, "b_zero_point"), same_as(4, 0, "bias"), same_as(5, 0, "z")}};
  }
  std::vector<AttrSpec> fused_matmul = epilogue;
  fused_matmul.push_back({"splits", AttrType::ints, false, "Y's columns in parts, one output each (one output)"});
  fused_matmul.push_back({"activated", AttrType::ints, false, "with splits: 1 for each output the activations apply to (all)"});
  fused_matmul.push_back({"gate_block", AttrType::int64, false,
                          "columns alternate this many values and their gates: Y = value * activation(gate), half as wide (none)"});
  r.add("", OpSchema{"FusedMatMul", "MatMul + bias [N] + activation + residual Z + activation, in one (f32; B may be bf16 or f16); its columns optionally split into several outputs", 2, 4,
                     1, kVariadic, fused_matmul, infer_fused_matmul})
      .traits = {.types = {input(0, DType::f32), input(1, lowp_weight, "B"), same_as(2, 0, "bias"), same_as(3, 0, "Z")},
                 .prepack_inputs = {1}};  // flops: the matmul's plus its epilogue's (flop_models.cc)
  r.add("", OpSchema{"MaxPool", "max over sliding windows, optional argmax indices", 1, 1, 1, 2,
                     {kAutoPad, kCeilMode, kDilations, kKernelShape, kPads,
                      {"storage_order", AttrType::int64, false, "0 row major, 1 column major indices"}, kStrides,
                      kChannelsLast},
                     infer_maxpool_any_layout})
      .traits.types = {input(0, kFloat | DType::i8 | DType::u8)};
  r.add("", OpSchema{"AveragePool", "mean over sliding windows", 1, 1, 1, 1,
                     {kAutoPad, kCeilMode, {"count_include_pad", AttrType::int64, false, "0"}, kDilations, kKernelShape, kPads, kStrides,
                      kChannelsLast},
                     infer_pool_any_layout})
      .traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"LpPool", "p-norm over sliding windows", 1, 1, 1, 1,
                     {kAutoPad, kCeilMode, kDilations, kKernelShape, {"p", AttrType::int64, false, "2"}, kPads, kStrides},
                     infer_pool}).traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"GlobalAveragePool", "mean over all spatial dims", 1, 1, 1, 1, {kChannelsLast}, infer_global_pool_any_layout})
      .traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"QGlobalAveragePool", "GlobalAveragePool of dequantized u8/s8 x, quantized (made by compile)", 5, 5, 1, 1,
                     {kChannelsLast}, infer_qglobal_average_pool})
      .traits.types = {input(0, DType::u8 | DType::i8, "x"), input(1, DType::f32, "x_scale"), same_as(2, 0, "x_zero_point"),
                       same_as(3, 1, "y_scale"), input(4, DType::u8 | DType::i8, "y_zero_point")};
  r.add("", OpSchema{"GlobalMaxPool", "max over all spatial dims", 1, 1, 1, 1, {kChannelsLast}, infer_global_pool_any_layout})
      .traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"GlobalLpPool", "p-norm over all spatial dims", 1, 1, 1, 1,
                     {{"p", AttrType::int64, false, "2"}}, infer_global_pool}).traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"LRN", "local response normalization across channels", 1, 1, 1, 1,
                     {{"alpha", AttrType::float64, false, "1e-4"}, {"beta", AttrType::float64, false, "0.75"},
                      {"bias", AttrType::float64, false, "1.0"}, {"size", AttrType::int64, true, "channels in the window"}},
                     infer_lrn}).traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"MaxUnpool", "scatter pooled values back to their argmax positions", 2, 3, 1, 1,
                     {kKernelShape, kPads, kStrides}, infer_max_unpool})
      .traits.types = {input(0, kFloat, "X"), input(1, DType::i64, "I")};
  r.add("", OpSchema{"Col2Im", "sum sliding blocks back into an image", 3, 3, 1, 1,
                     {kDilations, kPads, kStrides}, infer_col2im}).traits.types = {input(0, kFloat)};
  register_nn_sample_ops(r);
}

}  // namespace kiln
