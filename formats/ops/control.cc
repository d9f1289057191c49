// Core ops of the control family: If, Loop and Scan, whose bodies are subgraphs held in graph
// attributes. Output types and shapes come from the bodies' output values, which export has
// already inferred (a subgraph is converted and inferred before the node that owns it).
#include <algorithm>

#include "formats/op_schema.h"

namespace kiln {

namespace {

// What is certain about a value that may take shape `a` or shape `b`.
Shape merge_shapes(const Shape& a, const Shape& b) {
  if (!a.rank_known || !b.rank_known || a.rank() != b.rank()) return Shape::unknown_rank();
  Shape out = a;
  for (size_t i = 0; i < out.dims.size(); ++i)
    if (!(a.dims[i] == b.dims[i])) out.dims[i] = Dim::unknown();
  return out;
}

Result<const Graph*> body_attr(const InferContext& ctx, std::string_view name) {
  const Graph* g = ctx.node().attr_graph(name);
  if (!g) return ctx.error("attribute '" + std::string(name) + "' must be a graph");
  return g;
}

Status infer_if(InferContext& ctx) {
  const Shape& cs = ctx.shape(0);
  if (cs.is_concrete() && shape_numel(cs.concrete()) != 1)
    return ctx.error("condition has shape " + cs.str() + "; it must have one element");
  KILN_ASSIGN_OR_RETURN(const Graph* then_g, body_attr(ctx, "then_branch"));
  KILN_ASSIGN_OR_RETURN(const Graph* else_g, body_attr(ctx, "else_branch"));
  const size_t n = ctx.num_outputs();
  if (then_g->outputs.size() != n || else_g->outputs.size() != n)
    return ctx.error("the node has " + std::to_string(n) + " outputs but the branches have " +
                     std::to_string(then_g->outputs.size()) + " and " + std::to_string(else_g->outputs.size()));
  const Tensor* cond = ctx.value(0);
  for (size_t i = 0; i < n; ++i) {
    const Value& t = then_g->value(then_g->outputs[i]);
    const Value& e = else_g->value(else_g->outputs[i]);
    if (t.dtype != DType::undefined && e.dtype != DType::undefined && t.dtype != e.dtype)
      return ctx.error("output " + std::to_string(i) + " is " + std::string(dtype_name(t.dtype)) +
                       " in then_branch but " + std::string(dtype_name(e.dtype)) +
                       " in else_branch");
    DType d = t.dtype != DType::undefined ? t.dtype : e.dtype;
    if (cond && cond->numel() == 1) {
      ctx.set_output(i, d, cond->as_int64(0) ? t.shape : e.shape);
    } else {
      ctx.set_output(i, d, merge_shapes(t.shape, e.shape));
    }
  }
  return {};
}

// Loop: inputs (M, cond, v_initial...), body (iter, cond, v...) -> (cond, v..., scan...).
Status infer_loop(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Graph* body, body_attr(ctx, "body"));
  if (body->inputs.size() < 2) return ctx.error("the body has " + std::to_string(body->inputs.size()) + " inputs; it needs at least 2");
  const size_t ncarried = body->inputs.size() - 2;
  if (body->outputs.size() < 1 + ncarried)
    return ctx.error("the body has " + std::to_string(body->outputs.size()) + " outputs; it needs at least " +
                     std::to_string(1 + ncarried));
  const size_t nscan = body->outputs.size() - 1 - ncarried;
  const size_t given = ctx.num_inputs();
  if (given > 2 + ncarried || (ncarried > 0 && given != 2 + ncarried))
    return ctx.error("the node has " + std::to_string(given) + " inputs but the body carries " + std::to_string(ncarried) +
                     " values (expected " + std::to_string(2 + ncarried) + ")");
  if (ctx.num_outputs() != ncarried + nscan)
    return ctx.error("the node has " + std::to_string(ctx.num_outputs()) + " outputs but the body gives " +
                     std::to_string(ncarried + nscan));
  for (size_t i = 0; i < ncarried; ++i) {
    const Value& out = body->value(body->outputs[1 + i]);
    DType d = ctx.dtype(2 + i);
    if (out.dtype != DType::undefined && out.dtype != d)
      return ctx.error("loop-carried value " + std::to_string(i) + " is " + std::string(dtype_name(d)) +
                       " but the body returns " + std::string(dtype_name(out.dtype)));
    ctx.set_output(i, d, merge_shapes(ctx.shape(2 + i), out.shape));
  }
  // The trip count is known when M is known and the body's condition is the constant true.
  Dim trips = Dim::unknown();
  const Value& cond_out = body->value(body->outputs[0]);
  bool always = cond_out.is_constant() && cond_out.constant.numel() == 1 && cond_out.constant.as_int64(0) != 0;
  const Tensor* cond0 = ctx.value(1);
  bool starts = !ctx.has_input(1) || (cond0 && cond0->numel() == 1 && cond0->as_int64(0) != 0);
  if (const Tensor* m = ctx.value(0); m && m->numel() == 1 && always && starts)
    trips = Dim::known(std::max<int64_t>(0, m->as_int64(0)));
  for (size_t k = 0; k < nscan; ++k) {
    const Value& out = body->value(body->outputs[1 + ncarried + k]);
    Shape s = Shape::unknown_rank();
    if (out.shape.rank_known) {
      std::vector<Dim> dims{trips};
      dims.insert(dims.end(), out.shape.dims.begin(), out.shape.dims.end());
      s = Shape(std::move(dims));
    }
    ctx.set_output(ncarried + k, out.dtype, std::move(s));
  }
  return {};
}

// Scan (opset 9+): inputs (state..., scan_in...), body (state..., slice...) -> (state..., out_slice...).
Status infer_scan(InferContext& ctx) {
  const Node& node = ctx.node();
  KILN_ASSIGN_OR_RETURN(const Graph* body, body_attr(ctx, "body"));
  const int64_t m = node.attr_int("num_scan_inputs", 0);
  const size_t given = node.inputs.size();
  if (m < 1 || static_cast<size_t>(m) > given)
    return ctx.error("num_scan_inputs " + std::to_string(m) + " is out of range for " + std::to_string(given) + " inputs");
  const size_t nstate = given - static_cast<size_t>(m);
  if (body->inputs.size() != given)
    return ctx.error("the body has " + std::to_string(body->inputs.size()) + " inputs but the node has " + std::to_string(given));
  if (body->outputs.size() < nstate) return ctx.error("the body has fewer outputs than state values");
  const size_t nout = body->outputs.size() - nstate;
  if (ctx.num_outputs() != body->outputs.size())
    return ctx.error("the node has " + std::to_string(ctx.num_outputs()) + " outputs but the body gives " +
                     std::to_string(body->outputs.size()));
  std::vector<int64_t> in_axes = node.attr_ints("scan_input_axes", std::vector<int64_t>(static_cast<size_t>(m), 0));
  std::vector<int64_t> in_dirs = node.attr_ints("scan_input_directions", std::vector<int64_t>(static_cast<size_t>(m), 0));
  std::vector<int64_t> out_axes = node.attr_ints("scan_output_axes", std::vector<int64_t>(nout, 0));
  std::vector<int64_t> out_dirs = node.attr_ints("scan_output_directions", std::vector<int64_t>(nout, 0));
  if (in_axes.size() != static_cast<size_t>(m) || in_dirs.size() != static_cast<size_t>(m) || out_axes.size() != nout ||
      out_dirs.size() != nout)
    return ctx.error("scan axes / directions do not match the number of scan inputs and outputs");
  for (int64_t d : in_dirs) if (d != 0 && d != 1) return ctx.error("scan direction " + std::to_string(d) + " is not 0 or 1");
  for (int64_t d : out_dirs) if (d != 0 && d != 1) return ctx.error("scan direction " + std::to_string(d) + " is not 0 or 1");
  Dim len = Dim::unknown();
  for (size_t j = 0; j < static_cast<size_t>(m); ++j) {
    const Shape& s = ctx.shape(nstate + j);
    if (!s.rank_known) continue;
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(in_axes[j], s.rank(), ctx, "scan_input_axes entry"));
    const Dim& d = s.dims[static_cast<size_t>(ax)];
    if (d.is_known() && len.is_known() && d.value != len.value)
      return ctx.error("scan inputs have different sequence lengths " + std::to_string(len.value) + " and " + std::to_string(d.value));
    if (!len.is_known() && (d.is_known() || d.is_symbolic())) len = d;
  }
  for (size_t i = 0; i < nstate; ++i) {
    const Value& out = body->value(body->outputs[i]);
    if (out.dtype != DType::undefined && out.dtype != ctx.dtype(i))
      return ctx.error("state value " + std::to_string(i) + " is " + std::string(dtype_name(ctx.dtype(i))) +
                       " but the body returns " + std::string(dtype_name(out.dtype)));
    ctx.set_output(i, ctx.dtype(i), merge_shapes(ctx.shape(i), out.shape));
  }
  for (size_t k = 0; k < nout; ++k) {
    const Value& out = body->value(body->outputs[nstate + k]);
    Shape s = Shape::unknown_rank();
    if (out.shape.rank_known) {
      KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(out_axes[k], out.shape.rank() + 1, ctx, "scan_output_axes entry"));
      std::vector<Dim> dims = out.shape.dims;
      dims.insert(dims.begin() + ax, len);
      s = Shape(std::move(dims));
    }
    ctx.set_output(nstate + k, out.dtype, std::move(s));
  }
  return {};
}

}  // namespace

void register_control_ops(OpRegistry& r) {
  using namespace types;
  r.add("", OpSchema{"If", "runs then_branch or else_branch on a one-element bool condition", 1, 1, 1, kVariadic,
                     {{"then_branch", AttrType::graph, true, "graph run when the condition is true"},
                      {"else_branch", AttrType::graph, true, "graph run when the condition is false"}},
                     infer_if}).traits.types = {input(0, kBool, "condition")};
  r.add("", OpSchema{"Loop", "runs body while iteration < M and cond, carrying values and stacking scan outputs", 0,
                     kVariadic, 0, kVariadic,
                     {{"body", AttrType::graph, true, "(iteration, cond, carried...) -> (cond, carried..., scan...)"}},
                     infer_loop})
      .traits.types = {input(0, DType::i64, "trip count"), input(1, kBool, "condition")};
  r.add("", OpSchema{"Scan", "runs body over slices of the scan inputs, carrying state and stacking outputs", 1,
                     kVariadic, 1, kVariadic,
                     {{"body", AttrType::graph, true, "(state..., slices...) -> (state..., output slices...)"},
                      {"num_scan_inputs", AttrType::int64, true, "how many trailing inputs are scanned"},
                      {"scan_input_axes", AttrType::ints, false, "axis scanned per scan input, default 0"},
                      {"scan_input_directions", AttrType::ints, false, "0 forward, 1 reverse, default 0"},
                      {"scan_output_axes", AttrType::ints, false, "axis stacked per scan output, default 0"},
                      {"scan_output_directions", AttrType::ints, false, "0 append, 1 prepend, default 0"}},
                     infer_scan});
}

}  // namespace kiln
