// Reference kernels of the control family: If, Loop, Scan. Bodies run through
// KernelContext::run_subgraph. Results leaving a body are copied into the node's outputs rather
// than shared, because a body may return an enclosing graph's value, whose buffer the executor
// may hand to another value once the enclosing graph no longer needs it.
#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/kernel.h"
#include "runtime/ref/shape_util.h"

namespace kiln {

namespace {

// Stores a copy of t as output i, reusing the executor's buffer when it already fits.
void set_output_copy(KernelContext& ctx, size_t i, const Tensor& t) {
  if (i >= ctx.num_outputs()) return;
  Tensor& o = ref_shape::output_for(ctx, i, t.dtype(), t.shape());
  if (t.nbytes()) std::memcpy(o.raw(), t.raw(), t.nbytes());
}

// A scalar (or [1] when the body declares rank 1) body input.
template <class T>
Tensor body_scalar(const Graph& body, size_t input, T v) {
  const Value& bv = body.value(body.inputs[input]);
  std::vector<int64_t> shape;
  if (bv.shape.rank_known && bv.shape.rank() == 1) shape = {1};
  Tensor t(dtype_of<T>::value, shape);
  t.data<T>()[0] = v;
  return t;
}

// The shape an empty stack of body output `v` gets: its known dims, 0 where unknown.
std::vector<int64_t> empty_piece_shape(const Value& v) {
  std::vector<int64_t> s;
  if (v.shape.rank_known)
    for (const Dim& d : v.shape.dims) s.push_back(d.is_known() ? d.value : 0);
  return s;
}

// Stacks pieces (all of one shape) along `axis` of a new dim; pieces[p] lands at position p.
Status stack_output(KernelContext& ctx, size_t out, const std::vector<Tensor>& pieces, int64_t axis,
                    const Value& body_value) {
  std::vector<int64_t> piece_shape = pieces.empty() ? empty_piece_shape(body_value) : pieces[0].shape();
  DType dtype = pieces.empty() ? body_value.dtype : pieces[0].dtype();
  if (dtype == DType::undefined) dtype = DType::f32;
  const int64_t rank = static_cast<int64_t>(piece_shape.size());
  if (axis < 0) axis += rank + 1;
  if (axis < 0 || axis > rank)
    return ctx.error("scan output axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank + 1));
  for (const Tensor& p : pieces)
    if (p.shape() != piece_shape || p.dtype() != dtype)
      return ctx.error("scan output " + std::to_string(out) + " changes from " + shape_str(piece_shape) + " to " +
                       shape_str(p.shape()) + " between iterations");
  std::vector<int64_t> shape = piece_shape;
  shape.insert(shape.begin() + axis, static_cast<int64_t>(pieces.size()));
  Tensor& y = ctx.allocate_output(out, dtype, shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= piece_shape[static_cast<size_t>(d)];
  for (int64_t d = axis; d < rank; ++d) inner *= piece_shape[static_cast<size_t>(d)];
  const size_t chunk = static_cast<size_t>(inner) * dtype_size(dtype);
  const int64_t n = static_cast<int64_t>(pieces.size());
  for (int64_t p = 0; p < n; ++p)
    for (int64_t o = 0; o < outer; ++o)
      if (chunk)
        std::memcpy(static_cast<char*>(y.raw()) + static_cast<size_t>(o * n + p) * chunk,
                    static_cast<const char*>(pieces[static_cast<size_t>(p)].raw()) + static_cast<size_t>(o) * chunk, chunk);
  return {};
}

bool truthy(const Tensor& t) { return t.numel() > 0 && t.as_int64(0) != 0; }

Status ref_if(KernelContext& ctx) {
  const Tensor& cond = ctx.input(0);
  if (cond.numel() != 1) return ctx.error("condition has shape " + shape_str(cond.shape()) + "; it must have one element");
  const Graph* branch = ctx.node().attr_graph(truthy(cond) ? "then_branch" : "else_branch");
  if (!branch) return ctx.error("branch attribute is not a graph");
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, ctx.run_subgraph(*branch, {}));
  if (outs.size() != ctx.num_outputs())
    return ctx.error("the branch returned " + std::to_string(outs.size()) + " values for " + std::to_string(ctx.num_outputs()) + " outputs");
  for (size_t i = 0; i < outs.size(); ++i) set_output_copy(ctx, i, outs[i]);
  return {};
}

Status ref_loop(KernelContext& ctx) {
  const Graph* body = ctx.node().attr_graph("body");
  if (!body || body->inputs.size() < 2) return ctx.error("the body must be a graph with at least 2 inputs");
  const size_t ncarried = body->inputs.size() - 2;
  const size_t nscan = body->outputs.size() - 1 - ncarried;
  int64_t trips = std::numeric_limits<int64_t>::max();
  if (ctx.has_input(0)) {
    if (ctx.input(0).numel() != 1) return ctx.error("trip count must have one element");
    trips = ctx.input(0).as_int64(0);
  }
  bool cond = true;
  if (ctx.has_input(1)) {
    if (ctx.input(1).numel() != 1) return ctx.error("condition must have one element");
    cond = truthy(ctx.input(1));
  }
  std::vector<Tensor> carried;
  for (size_t i = 0; i < ncarried; ++i) carried.push_back(ctx.input(2 + i));
  std::vector<std::vector<Tensor>> scans(nscan);
  for (int64_t it = 0; it < trips && cond; ++it) {
    std::vector<Tensor> in{body_scalar<int64_t>(*body, 0, it), body_scalar<bool>(*body, 1, cond)};
    in.insert(in.end(), carried.begin(), carried.end());
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> out, ctx.run_subgraph(*body, std::move(in)));
    if (out.size() != 1 + ncarried + nscan) return ctx.error("the body returned the wrong number of values");
    if (out[0].numel() != 1) return ctx.error("the body's condition output must have one element");
    cond = truthy(out[0]);
    for (size_t i = 0; i < ncarried; ++i) carried[i] = out[1 + i];
    for (size_t k = 0; k < nscan; ++k) scans[k].push_back(out[1 + ncarried + k]);
  }
  for (size_t i = 0; i < ncarried; ++i) set_output_copy(ctx, i, carried[i]);
  for (size_t k = 0; k < nscan; ++k)
    if (ncarried + k < ctx.num_outputs())
      KILN_RETURN_IF_ERROR(stack_output(ctx, ncarried + k, scans[k], 0, body->value(body->outputs[1 + ncarried + k])));
  return {};
}

// Copies index `pos` along `axis` of t into a new tensor of rank - 1.
Tensor slice_along(const Tensor& t, int64_t axis, int64_t pos) {
  std::vector<int64_t> shape = t.shape();
  const int64_t len = shape[static_cast<size_t>(axis)];
  shape.erase(shape.begin() + axis);
  Tensor s(t.dtype(), shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= t.dim(d);
  for (int64_t d = axis + 1; d < t.rank(); ++d) inner *= t.dim(d);
  const size_t chunk = static_cast<size_t>(inner) * dtype_size(t.dtype());
  for (int64_t o = 0; o < outer; ++o)
    if (chunk)
      std::memcpy(static_cast<char*>(s.raw()) + static_cast<size_t>(o) * chunk,
                  static_cast<const char*>(t.raw()) + static_cast<size_t>(o * len + pos) * chunk, chunk);
  return s;
}

Status ref_scan(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Graph* body = node.attr_graph("body");
  if (!body) return ctx.error("the body must be a graph");
  const size_t m = static_cast<size_t>(node.attr_int("num_scan_inputs", 0));
  const size_t given = node.inputs.size();
  if (m < 1 || m > given) return ctx.error("num_scan_inputs is out of range");
  const size_t nstate = given - m;
  const size_t nout = body->outputs.size() - nstate;
  std::vector<int64_t> in_axes = node.attr_ints("scan_input_axes", std::vector<int64_t>(m, 0));
  std::vector<int64_t> in_dirs = node.attr_ints("scan_input_directions", std::vector<int64_t>(m, 0));
  std::vector<int64_t> out_axes = node.attr_ints("scan_output_axes", std::vector<int64_t>(nout, 0));
  std::vector<int64_t> out_dirs = node.attr_ints("scan_output_directions", std::vector<int64_t>(nout, 0));
  int64_t len = -1;
  for (size_t j = 0; j < m; ++j) {
    const Tensor& x = ctx.input(nstate + j);
    int64_t ax = in_axes[j] < 0 ? in_axes[j] + x.rank() : in_axes[j];
    if (ax < 0 || ax >= x.rank()) return ctx.error("scan_input_axes entry " + std::to_string(in_axes[j]) + " is out of range");
    in_axes[j] = ax;
    if (len >= 0 && x.dim(ax) != len)
      return ctx.error("scan inputs have different sequence lengths " + std::to_string(len) + " and " + std::to_string(x.dim(ax)));
    len = x.dim(ax);
  }
  std::vector<Tensor> state;
  for (size_t i = 0; i < nstate; ++i) state.push_back(ctx.input(i));
  std::vector<std::vector<Tensor>> outs(nout);
  for (int64_t t = 0; t < len; ++t) {
    std::vector<Tensor> in = state;
    for (size_t j = 0; j < m; ++j)
      in.push_back(slice_along(ctx.input(nstate + j), in_axes[j], in_dirs[j] ? len - 1 - t : t));
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> res, ctx.run_subgraph(*body, std::move(in)));
    if (res.size() != nstate + nout) return ctx.error("the body returned the wrong number of values");
    for (size_t i = 0; i < nstate; ++i) state[i] = res[i];
    for (size_t k = 0; k < nout; ++k) outs[k].push_back(res[nstate + k]);
  }
  for (size_t i = 0; i < nstate; ++i) set_output_copy(ctx, i, state[i]);
  for (size_t k = 0; k < nout; ++k) {
    if (out_dirs[k]) std::reverse(outs[k].begin(), outs[k].end());
    KILN_RETURN_IF_ERROR(stack_output(ctx, nstate + k, outs[k], out_axes[k], body->value(body->outputs[nstate + k])));
  }
  return {};
}

}  // namespace

void register_ref_control(KernelRegistry& r) {
  r.add_reference("If", ref_if);
  r.add_reference("Loop", ref_loop);
  r.add_reference("Scan", ref_scan);
}

}  // namespace kiln
