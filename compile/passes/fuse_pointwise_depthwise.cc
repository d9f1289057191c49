// fuse_pointwise_depthwise: a channels-last 1x1 convolution whose output only a depthwise
// convolution reads becomes one PointwiseDepthwiseConv, which never stores that output whole.
//
//   FusedConv 1x1(X, W1, B1; act1) -> T -> FusedConv depthwise(T, W2, B2; act2)
//     =>   PointwiseDepthwiseConv(X, W1, B1, W2, B2; pointwise_activation act1, activation act2)
//
// MobileNetV2's and EfficientNet's inverted residual blocks start so: the expansion writes T
// (MobileNetV2's first, 112x112x96: 4.8 MB, past L2) and the depthwise convolution reads it
// back; kiln.pointwise_depthwise computes T's rows into a ring of row buffers as the depthwise
// rows need them. Both stages f32 with constant weights, no residual or second activation in
// either, the depthwise filter at most 16 rows, stride 1 or 2, no dilation; the target needs
// AVX2. Only where T is large (pays, below).
#include <algorithm>
#include <set>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/ops/epilogue.h"
#include "formats/ops/nn_util.h"

namespace kiln {

namespace {

constexpr int64_t kMaxFilterRows = 16;  // kiln.pointwise_depthwise's (kDwconvNhwcMaxRows)
constexpr int64_t kMinBytes = int64_t{1} << 20;  // the intermediate tensor's size from which fusing paid

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

// Whether `n` is a channels-last f32 FusedConv of X alone (no residual, no second activation,
// no parts, no lowered types) whose weight is a constant f32 [K, C/group, KH, KW].
bool plain_conv(const Graph& g, const Node& n) {
  if (n.op != "FusedConv" || !n.domain.empty() || n.outputs.size() != 1 || n.attr_int("channels_last", 0) != 1) return false;
  for (const char* a : {"x_parts", "x_channels_first", "int8_operands", "output_type", "post_activation"})
    if (n.has_attr(a)) return false;
  if (n.has_input(3) || !n.has_input(0) || !n.has_input(1) || !read_activation(n, "activation").ok()) return false;
  if (const std::string pad = n.attr_string("auto_pad", "NOTSET"); pad != "NOTSET" && pad != "VALID") return false;
  for (int64_t v : n.attr_ints("dilations")) if (v != 1) return false;
  const Value& x = g.value(n.inputs[0]);
  const Value& w = g.value(n.inputs[1]);
  if (x.dtype != DType::f32 || !x.shape.is_concrete() || x.shape.rank() != 4 || g.value(n.outputs[0]).dtype != DType::f32) return false;
  if (n.has_input(2) && g.value(n.inputs[2]).dtype != DType::f32) return false;
  return w.is_constant() && w.dtype == DType::f32 && w.constant.rank() == 4;
}

bool pointwise(const Graph& g, const Node& n) {
  if (!plain_conv(g, n) || n.attr_int("group", 1) != 1) return false;
  for (int64_t v : n.attr_ints("strides")) if (v != 1) return false;
  for (int64_t v : n.attr_ints("pads")) if (v != 0) return false;
  const Tensor& w = g.value(n.inputs[1]).constant;
  return w.dim(2) == 1 && w.dim(3) == 1;
}

bool depthwise(const Graph& g, const Node& n, int64_t channels) {
  if (!plain_conv(g, n) || n.attr_int("group", 1) != channels) return false;
  const Tensor& w = g.value(n.inputs[1]).constant;
  if (w.dim(0) != channels || w.dim(1) != 1 || w.dim(2) > kMaxFilterRows) return false;
  const std::vector<int64_t> s = n.attr_ints("strides", {1, 1});
  return s.size() == 2 && s[0] == s[1] && (s[0] == 1 || s[0] == 2);
}

}  // namespace

Result<PassResult> fuse_pointwise_depthwise(Model& model, PassContext& ctx) {
  if (!ctx.target.cpu.avx2 || !ctx.target.cpu.fma) return PassResult{};
  Graph& g = model.graph;
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  std::vector<int64_t> producer(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId v : g.nodes[i].outputs)
      if (v != kNoValue) producer[static_cast<size_t>(v)] = static_cast<int64_t>(i);
  std::vector<char> gone(g.nodes.size(), 0);
  size_t fused = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& dw = g.nodes[i];
    if (dw.op != "FusedConv" || !dw.has_input(0)) continue;
    const ValueId t = dw.inputs[0];
    const int64_t p = producer[static_cast<size_t>(t)];
    if (p < 0 || gone[static_cast<size_t>(p)] || outputs.count(t) || uses[static_cast<size_t>(t)].size() != 1) continue;
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
    for (const std::string& s : dw.sources.empty() ? std::vector<std::string>{dw.name} : dw.sources)
      if (std::find(f.sources.begin(), f.sources.end(), s) == f.sources.end()) f.sources.push_back(s);
    dw = std::move(f);
    gone[static_cast<size_t>(p)] = 1;
    ++fused;
  }
  if (fused == 0) return PassResult{};
  erase_nodes(g, gone);
  drop_unused_values(g);
  return PassResult{true, "fused " + count_of(fused, "pointwise convolution", "pointwise convolutions") +
                              " into the depthwise convolution after it"};
}

}  // namespace kiln
