// fuse_pointwise_depthwise: a channels-last 1x1 convolution whose output only a depthwise
// convolution reads, and a 1x1 convolution (a projection) that alone reads a depthwise
// convolution's output, become one PointwiseDepthwiseConv, which never stores those outputs
// whole.
//
//   FusedConv 1x1(X, W1, B1; act1) -> T -> FusedConv depthwise(T, W2, B2; act2) -> D
//     -> FusedConv 1x1(D, W3, B3, Z; act3)
//     =>   PointwiseDepthwiseConv(X, W1, B1, W2, B2, W3, B3, Z; pointwise_activation act1,
//                                 activation act2, projection_activation act3)
//
// MobileNetV2's and EfficientNet's inverted residual blocks are so (EfficientNet's with a
// squeeze-excitation between D and the projection, which keeps that apart): the expansion
// writes T (MobileNetV2's first, 112x112x96: 4.8 MB, past L2) and the depthwise convolution
// reads it back, then writes D for the projection to read. kiln.pointwise_depthwise computes
// T's rows into a ring of row buffers as the depthwise rows need them, and projects the
// depthwise rows as they come. Two sweeps: the expansions first, then the projections, into a
// node of the first sweep or into a depthwise convolution alone (the node then has no W1).
// Every stage f32 with constant weights, no second activation, no residual but the
// projection's (Z of Y's shape); the depthwise filter at most 16 rows, stride 1 or 2, no
// dilation; the target needs AVX2. Only where T or D is large (pays, projection_pays, below).
// A weight may be f16 (`--precision fp16`), widened as the kernel packs it: every depthwise
// one (those compute in f32 either way), and a 1x1 one that the f16 GEMM's default rule leaves
// to f32 or that gains least from f16 (gemm::f16_pointwise_fuses: the mobile networks'
// expansions of 16-64 channels over 28x28 pixels or more, where the fused block outran the f16
// GEMM, and their projections to 32 or fewer). The f16 GEMM keeps the others, twice f32's rate.
#include <algorithm>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/ops/epilogue.h"
#include "formats/ops/nn_util.h"

namespace kiln {

namespace {

constexpr int64_t kMaxFilterRows = 16;  // kiln.pointwise_depthwise's (kDwconvNhwcMaxRows)
constexpr int64_t kMinBytes = int64_t{1} << 20;  // the intermediate tensors' size from which fusing paid

// The rule (docs/architecture.md has the table): fuse where the intermediate tensor T takes
// 1 MiB or more, and for a stride-2 depthwise convolution 1 MiB or more a thread. Those pairs
// took 0.78-0.92 of the two nodes' time at one thread and 0.85-0.95 at two (MobileNetV2's and
// EfficientNet-B0's 112x112 and 56x56 ones). Over a smaller T, which stays in L2, oneDNN's 1x1
// convolution over the whole image and the depthwise kernel after it ran as fast or faster
// (their 28x28 pairs 0.99-1.10, 14x14 0.96-1.12, 7x7 1.07-1.49); at stride 2 each output row
// needs two new rows of T for a quarter of the depthwise work, and with T split between the
// threads' L2 caches the row products lost (the 56x56x144 ones at two threads: 1.02-1.05).
bool pays(int64_t t_bytes, int64_t stride, int threads) {
  return t_bytes >= kMinBytes && (stride == 1 || t_bytes / std::max(1, threads) >= kMinBytes);
}

// A projection: where the depthwise convolution's input T or its output D takes 1 MiB or more
// (the same table). MobileNetV2's first four took 0.90-0.95 of the nodes' time at one thread
// and two (its 112x112x32 and 56x56 depthwise outputs, and the 56x56x144 input of the stride-2
// one); with T and D under 1 MiB they ran from 0.97 to 1.29 at one thread (the 28x28 ones
// 0.97-1.02, 14x14 1.02-1.29, 7x7 1.12-1.14), where the projection's GEMM over one or two rows
// of a small image is short and D stayed in L2 anyway.
bool projection_pays(int64_t t_bytes, int64_t d_bytes) { return std::max(t_bytes, d_bytes) >= kMinBytes; }

// Whether `n` is a channels-last f32 FusedConv of X (with `residual`, optionally a residual Z
// of Y's shape after the activation; otherwise none), with no second activation, no parts, no
// lowered activations, whose weight is a constant f32 or f16 [K, C/group, KH, KW].
bool plain_conv(const Graph& g, const Node& n, bool residual = false) {
  if (n.op != "FusedConv" || !n.domain.empty() || n.outputs.size() != 1 || n.attr_int("channels_last", 0) != 1) return false;
  for (const char* a : {"x_parts", "x_channels_first", "int8_operands", "output_type", "post_activation"})
    if (n.has_attr(a)) return false;
  if (!n.has_input(0) || !n.has_input(1) || !read_activation(n, "activation").ok() || n.inputs.size() > 4) return false;
  if (n.has_input(3)) {
    const Value& z = g.value(n.inputs[3]);
    if (!residual || z.dtype != DType::f32 || !z.shape.is_concrete() || z.shape != g.value(n.outputs[0]).shape) return false;
  }
  if (const std::string pad = n.attr_string("auto_pad", "NOTSET"); pad != "NOTSET" && pad != "VALID") return false;
  for (int64_t v : n.attr_ints("dilations")) if (v != 1) return false;
  const Value& x = g.value(n.inputs[0]);
  const Value& w = g.value(n.inputs[1]);
  if (x.dtype != DType::f32 || !x.shape.is_concrete() || x.shape.rank() != 4 || g.value(n.outputs[0]).dtype != DType::f32) return false;
  if (n.has_input(2) && g.value(n.inputs[2]).dtype != DType::f32) return false;
  return w.is_constant() && (w.dtype == DType::f32 || w.dtype == DType::f16) && w.constant.rank() == 4;
}

bool pointwise(const Graph& g, const Node& n, bool residual = false) {
  if (!plain_conv(g, n, residual) || n.attr_int("group", 1) != 1) return false;
  for (int64_t v : n.attr_ints("strides")) if (v != 1) return false;
  for (int64_t v : n.attr_ints("pads")) if (v != 0) return false;
  const Tensor& w = g.value(n.inputs[1]).constant;
  return w.dim(2) == 1 && w.dim(3) == 1 && pointwise_fuses_in_f32(g, n);
}

bool depthwise(const Graph& g, const Node& n, int64_t channels) {
  if (!plain_conv(g, n) || n.attr_int("group", 1) != channels) return false;
  const Tensor& w = g.value(n.inputs[1]).constant;
  if (w.dim(0) != channels || w.dim(1) != 1 || w.dim(2) > kMaxFilterRows) return false;
  const std::vector<int64_t> s = n.attr_ints("strides", {1, 1});
  return s.size() == 2 && s[0] == s[1] && (s[0] == 1 || s[0] == 2);
}

// `into` takes `from`'s sources (or its name) after its own, each once.
void add_sources(Node& into, const Node& from) {
  for (const std::string& s : from.sources.empty() ? std::vector<std::string>{from.name} : from.sources)
    if (std::find(into.sources.begin(), into.sources.end(), s) == into.sources.end()) into.sources.push_back(s);
}

// Sweep 1: each 1x1 expansion into the depthwise convolution that alone reads it.
size_t fuse_expansions(Graph& g, const PassContext& ctx, std::vector<char>& gone) {
  const Matcher m(g);
  size_t fused = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& dw = g.nodes[i];
    if (dw.op != "FusedConv" || !dw.has_input(0)) continue;
    const ValueId t = dw.inputs[0];
    const int32_t p = m.def_index(t);
    if (p < 0 || gone[static_cast<size_t>(p)] || !m.single_reader(t)) continue;
    const Node& pw = g.nodes[static_cast<size_t>(p)];
    if (!pointwise(g, pw)) continue;
    const Shape& ts = g.value(t).shape;
    if (!ts.is_concrete() || !depthwise(g, dw, ts.dims[3].value)) continue;
    if (!pays(shape_numel(ts.concrete()) * static_cast<int64_t>(sizeof(float)), dw.attr_ints("strides", {1, 1})[0], ctx.target.threads))
      continue;
    Node f;
    f.name = dw.name;
    f.op = "PointwiseDepthwiseConv";
    f.inputs = {pw.inputs[0], pw.inputs[1], pw.has_input(2) ? pw.inputs[2] : kNoValue, dw.inputs[1],
                dw.has_input(2) ? dw.inputs[2] : kNoValue};
    while (!f.inputs.empty() && f.inputs.back() == kNoValue) f.inputs.pop_back();
    f.outputs = dw.outputs;
    for (const Attribute& a : dw.attrs) f.set_attr(a.name, a.value);
    for (const Attribute& a : pw.attrs) {
      if (a.name == "activation") f.set_attr("pointwise_activation", a.value);
      else if (a.name == "activation_params") f.set_attr("pointwise_activation_params", a.value);
    }
    f.sources = pw.sources.empty() ? std::vector<std::string>{pw.name} : pw.sources;
    add_sources(f, dw);
    dw = std::move(f);
    gone[static_cast<size_t>(p)] = 1;
    ++fused;
  }
  return fused;
}

// Sweep 2: each 1x1 projection into the depthwise convolution (fused with its expansion by
// sweep 1, or alone) whose output it alone reads.
size_t fuse_projections(Graph& g, std::vector<char>& gone) {
  const Matcher m(g);
  size_t fused = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& pj = g.nodes[i];
    if (gone[i] || !pointwise(g, pj, true)) continue;
    const ValueId d = pj.inputs[0];
    const int32_t p = m.def_index(d);
    if (p < 0 || gone[static_cast<size_t>(p)] || !m.single_reader(d)) continue;
    const Node& dw = g.nodes[static_cast<size_t>(p)];
    const Shape& ds = g.value(d).shape;
    const bool expanded = dw.op == "PointwiseDepthwiseConv" && !dw.has_input(5);
    if (!expanded && !depthwise(g, dw, ds.dims[3].value)) continue;
    // T: the depthwise convolution's input, X's pixels by W2's channels.
    const std::vector<int64_t> xs = g.value(dw.inputs[0]).shape.concrete();
    const int64_t t_bytes = shape_numel(xs) / xs[3] * ds.dims[3].value * static_cast<int64_t>(sizeof(float));
    if (!projection_pays(t_bytes, shape_numel(ds.concrete()) * static_cast<int64_t>(sizeof(float)))) continue;
    Node f;
    f.name = pj.name;
    f.op = "PointwiseDepthwiseConv";
    if (expanded) {
      f.inputs = dw.inputs;
      f.attrs = dw.attrs;
      f.sources = dw.sources;
    } else {
      f.inputs = {dw.inputs[0], kNoValue, kNoValue, dw.inputs[1], dw.has_input(2) ? dw.inputs[2] : kNoValue};
      for (const Attribute& a : dw.attrs) f.set_attr(a.name, a.value);
      f.sources = dw.sources.empty() ? std::vector<std::string>{dw.name} : dw.sources;
    }
    f.inputs.resize(5, kNoValue);
    f.inputs.insert(f.inputs.end(), {pj.inputs[1], pj.has_input(2) ? pj.inputs[2] : kNoValue, pj.has_input(3) ? pj.inputs[3] : kNoValue});
    while (f.inputs.back() == kNoValue) f.inputs.pop_back();
    f.outputs = pj.outputs;
    for (const Attribute& a : pj.attrs) {
      if (a.name == "activation") f.set_attr("projection_activation", a.value);
      else if (a.name == "activation_params") f.set_attr("projection_activation_params", a.value);
    }
    add_sources(f, pj);
    pj = std::move(f);
    gone[static_cast<size_t>(p)] = 1;
    ++fused;
  }
  return fused;
}

}  // namespace

Result<PassResult> fuse_pointwise_depthwise(Model& model, PassContext& ctx) {
  if (!ctx.target.cpu.avx2 || !ctx.target.cpu.fma) return PassResult{};
  Graph& g = model.graph;
  std::vector<char> gone(g.nodes.size(), 0);
  const size_t expansions = fuse_expansions(g, ctx, gone);
  if (expansions > 0) {
    erase_nodes(g, gone);
    gone.assign(g.nodes.size(), 0);
  }
  const size_t projections = fuse_projections(g, gone);
  if (expansions + projections == 0) return PassResult{};
  if (projections > 0) erase_nodes(g, gone);
  drop_unused_values(g);
  std::string what;
  if (expansions > 0) what = "fused " + count_of(expansions, "pointwise convolution", "pointwise convolutions") + " into the depthwise convolution after it";
  if (projections > 0)
    what += (what.empty() ? "fused " : "; ") + count_of(projections, "projection", "projections") + " into the depthwise convolution before it";
  return PassResult{true, what};
}

}  // namespace kiln
