// fuse_epilogues: a convolution or matrix product and the elementwise ops after it become one
// FusedConv / FusedMatMul (formats/ops/epilogue.h):
//
//   Conv | MatMul | Gemm (alpha 1, transA 0, a bias of one value per column)
//     [+ Add of a per-channel constant]      -> the bias (summed with one already there)
//     [+ Mul by a per-channel constant]      -> the weights and bias scaled (constant weights)
//     [+ activation]                         -> activation
//     [+ Add of another tensor of Y's shape] -> the residual input Z
//     [+ activation]                         -> post_activation
//
// in that order, each step only when the value it reads has no other reader and is not a
// graph output. Activations: Relu, LeakyRelu, Clip with constant bounds, Sigmoid, Tanh,
// HardSigmoid, HardSwish, Gelu (both forms), and x * Sigmoid(x) as Silu. f32 only. The fused
// node keeps the first node's name and every absorbed node's sources.
#include "compile/passes/fuse_epilogues.h"

#include <algorithm>
#include <limits>
#include <set>

#include "formats/ops/epilogue.h"

namespace kiln {

namespace {

struct Fusion {
  bool conv = false;        // FusedConv (channels on axis 1) or FusedMatMul (on the last axis)
  ValueId x = kNoValue, w = kNoValue, bias = kNoValue, z = kNoValue;
  std::vector<Attribute> attrs;  // the conv's geometry
  ActivationSpec act, post;
  ValueId out = kNoValue;        // the value the fused node produces so far
  std::vector<size_t> absorbed;  // node indices, the first is the root
};

bool is_f32(const Graph& g, ValueId v) { return v != kNoValue && g.value(v).dtype == DType::f32; }

// The single node reading `v` (through an input, never a capture), or -1.
int64_t single_reader(const Graph& g, const std::vector<std::vector<Use>>& uses, const std::set<ValueId>& outputs,
                      ValueId v) {
  if (outputs.count(v)) return -1;
  const std::vector<Use>& u = uses[static_cast<size_t>(v)];
  if (u.size() != 1 || u[0].slot == Use::kCaptured) return -1;
  return static_cast<int64_t>(u[0].node);
}

// The channel count of the fused output (axis 1 of a conv, the last axis of a matmul), or -1.
int64_t channels(const Graph& g, const Fusion& f) {
  const Shape& s = g.value(f.out).shape;
  if (s.rank() < (f.conv ? 2 : 1)) return -1;
  const Dim& d = f.conv ? s.dims[1] : s.dims.back();
  return d.is_known() ? d.value : -1;
}

// A constant that broadcasts onto Y with one value per channel: its dims, aligned right, are 1
// except the channel axis, which is 1 or C. Returns its C values (repeated when it is 1).
std::optional<std::vector<float>> per_channel(const Graph& g, const Fusion& f, ValueId v) {
  const Value& val = g.value(v);
  if (!val.is_constant() || val.dtype != DType::f32) return std::nullopt;
  const int64_t c = channels(g, f);
  const int64_t rank = g.value(f.out).shape.rank();
  if (c < 0) return std::nullopt;
  const std::vector<int64_t>& s = val.constant.shape();
  if (static_cast<int64_t>(s.size()) > rank) return std::nullopt;
  const int64_t axis = f.conv ? 1 : rank - 1;
  int64_t per = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t a = rank - static_cast<int64_t>(s.size()) + static_cast<int64_t>(i);
    if (a == axis) per = s[i];
    else if (s[i] != 1) return std::nullopt;
  }
  if (per != 1 && per != c) return std::nullopt;
  const float* p = val.constant.data<float>();
  std::vector<float> out(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) out[static_cast<size_t>(i)] = p[per == 1 ? 0 : i];
  return out;
}

// A constant scalar input's value (Clip's bounds), or nullopt.
std::optional<float> scalar_constant(const Graph& g, const Node& n, size_t slot) {
  if (!n.has_input(slot)) return std::nullopt;
  const Value& v = g.value(n.inputs[slot]);
  if (!v.is_constant() || v.dtype != DType::f32 || v.constant.numel() != 1) return std::nullopt;
  return v.constant.data<float>()[0];
}

// The activation node `n` applies to `in`, or nullopt when it is not one the epilogue has.
std::optional<ActivationSpec> activation_of(const Graph& g, const Node& n, ValueId in) {
  if (n.inputs.empty() || n.inputs[0] != in) return std::nullopt;
  float bounds[2] = {std::numeric_limits<float>::lowest(), std::numeric_limits<float>::max()};
  if (n.op == "Clip" && n.domain.empty())
    for (size_t slot = 1; slot <= 2; ++slot) {
      if (!n.has_input(slot)) continue;
      std::optional<float> v = scalar_constant(g, n, slot);
      if (!v) return std::nullopt;
      bounds[slot - 1] = *v;
    }
  return activation_of_node(n, bounds[0], bounds[1]);
}

// x * Sigmoid(x): `v` read by exactly a Sigmoid s and a Mul(v, s) (either order), s by the Mul
// only. Returns the Mul's index and the Sigmoid's.
std::optional<std::pair<size_t, size_t>> silu_of(const Graph& g, const std::vector<std::vector<Use>>& uses,
                                                 const std::set<ValueId>& outputs, ValueId v) {
  if (outputs.count(v)) return std::nullopt;
  const std::vector<Use>& u = uses[static_cast<size_t>(v)];
  if (u.size() != 2 || u[0].slot == Use::kCaptured || u[1].slot == Use::kCaptured) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const size_t si = u[static_cast<size_t>(k)].node, mi = u[static_cast<size_t>(1 - k)].node;
    const Node& s = g.nodes[si];
    const Node& m = g.nodes[mi];
    if (s.op != "Sigmoid" || !s.domain.empty() || m.op != "Mul" || !m.domain.empty() || s.outputs.size() != 1) continue;
    const ValueId sv = s.outputs[0];
    if (single_reader(g, uses, outputs, sv) != static_cast<int64_t>(mi)) continue;
    if ((m.inputs[0] == v && m.inputs[1] == sv) || (m.inputs[0] == sv && m.inputs[1] == v)) return std::make_pair(mi, si);
  }
  return std::nullopt;
}

// The other operand of a two-input node that reads `v`, or kNoValue.
ValueId other_operand(const Node& n, ValueId v) {
  if (n.inputs.size() != 2) return kNoValue;
  if (n.inputs[0] == v && n.inputs[1] != v) return n.inputs[1];
  if (n.inputs[1] == v && n.inputs[0] != v) return n.inputs[0];
  return kNoValue;
}

// Starts a fusion at node i when it is a conv or matmul the fused ops can express.
std::optional<Fusion> start(Graph& g, size_t i) {
  const Node& n = g.nodes[i];
  if (!n.domain.empty() || n.outputs.size() != 1 || !is_f32(g, n.outputs[0])) return std::nullopt;
  Fusion f;
  f.out = n.outputs[0];
  f.absorbed = {i};
  if (n.op == "Conv") {
    f.conv = true;
    f.x = n.inputs[0];
    f.w = n.inputs[1];
    if (n.has_input(2)) f.bias = n.inputs[2];
    f.attrs = n.attrs;
    return f;
  }
  if (n.op == "MatMul") {
    if (g.value(n.inputs[1]).shape.rank() < 2 || g.value(n.inputs[0]).shape.rank() < 1) return std::nullopt;
    f.x = n.inputs[0];
    f.w = n.inputs[1];
    return f;
  }
  if (n.op == "Gemm") {
    if (n.attr_float("alpha", 1.0) != 1.0 || n.attr_int("transA", 0) != 0) return std::nullopt;
    f.x = n.inputs[0];
    f.w = n.inputs[1];
    if (n.attr_int("transB", 0) != 0) {
      // B is [N, K]: a constant one is transposed once here; a computed one stays a Gemm.
      const Value& b = g.value(n.inputs[1]);
      if (!b.is_constant() || b.constant.rank() != 2) return std::nullopt;
      const int64_t rows = b.constant.dim(0), cols = b.constant.dim(1);
      Tensor t(DType::f32, {cols, rows});
      const float* src = b.constant.data<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t.data<float>()[c * rows + r] = src[r * cols + c];
      f.w = g.add_constant(b.name + "_t", std::move(t));
    }
    if (n.has_input(2)) {
      std::optional<std::vector<float>> c = per_channel(g, f, n.inputs[2]);
      if (!c) return std::nullopt;
      const float beta = static_cast<float>(n.attr_float("beta", 1.0));
      for (float& v : *c) v *= beta;
      f.bias = g.add_constant(g.value(n.inputs[2]).name + "_bias", Tensor::from<float>({static_cast<int64_t>(c->size())}, *c));
    }
    return f;
  }
  return std::nullopt;
}

// The fusion's bias as C values (zeros when it has none), or nullopt when it is not constant.
std::optional<std::vector<float>> bias_values(const Graph& g, const Fusion& f) {
  const int64_t c = channels(g, f);
  if (f.bias == kNoValue) return std::vector<float>(static_cast<size_t>(c), 0.f);
  const Value& b = g.value(f.bias);
  if (!b.is_constant() || b.constant.numel() != c) return std::nullopt;
  return std::vector<float>(b.constant.data<float>(), b.constant.data<float>() + c);
}

// Tries to absorb node `ci` (the single reader of f.out); false when it does not fit.
bool absorb(Graph& g, Fusion& f, size_t ci, const std::vector<std::vector<Use>>& uses, const std::set<ValueId>& outputs) {
  const Node& c = g.nodes[ci];
  if (!c.domain.empty() || c.outputs.size() != 1 || !is_f32(g, c.outputs[0])) return false;
  const bool plain = f.act.kind == Activation::none && f.z == kNoValue;
  if (c.op == "Add" && plain && f.post.kind == Activation::none) {
    const ValueId other = other_operand(c, f.out);
    if (other == kNoValue) return false;
    if (std::optional<std::vector<float>> add = per_channel(g, f, other)) {
      if (channels(g, f) < 0) return false;
      std::optional<std::vector<float>> b = bias_values(g, f);
      if (!b) return false;
      for (size_t i = 0; i < b->size(); ++i) (*b)[i] += (*add)[i];
      f.bias = g.add_constant(g.value(c.outputs[0]).name + "_bias", Tensor::from<float>({static_cast<int64_t>(b->size())}, *b));
      f.absorbed.push_back(ci);
      f.out = c.outputs[0];
      return true;
    }
  }
  if (c.op == "Add" && f.z == kNoValue && f.post.kind == Activation::none) {
    // The residual: another tensor of exactly Y's shape.
    const ValueId other = other_operand(c, f.out);
    if (other == kNoValue || !is_f32(g, other)) return false;
    const Shape& ys = g.value(f.out).shape;
    if (!ys.rank_known || g.value(other).shape != ys || g.value(c.outputs[0]).shape != ys) return false;
    f.z = other;
    f.absorbed.push_back(ci);
    f.out = c.outputs[0];
    return true;
  }
  if (c.op == "Mul" && plain && f.post.kind == Activation::none) {
    // y * s per channel: W's output channels and the bias scaled by s.
    const ValueId other = other_operand(c, f.out);
    if (other == kNoValue) return false;
    std::optional<std::vector<float>> s = per_channel(g, f, other);
    const Value& w = g.value(f.w);
    if (!s || !w.is_constant() || channels(g, f) < 0) return false;
    std::optional<std::vector<float>> b = bias_values(g, f);
    if (!b) return false;
    const int64_t cn = channels(g, f);
    Tensor scaled = w.constant.clone();
    float* pw = scaled.data<float>();
    if (f.conv) {  // W is [M, C/group, k...]: one block per output channel
      if (scaled.dim(0) != cn) return false;
      const int64_t per = scaled.numel() / cn;
      for (int64_t m = 0; m < cn; ++m)
        for (int64_t k = 0; k < per; ++k) pw[m * per + k] *= (*s)[static_cast<size_t>(m)];
    } else {  // B is [..., K, N]: every row scaled column-wise
      if (scaled.rank() < 2 || scaled.shape().back() != cn) return false;
      for (int64_t r = 0, rows = scaled.numel() / cn; r < rows; ++r)
        for (int64_t n = 0; n < cn; ++n) pw[r * cn + n] *= (*s)[static_cast<size_t>(n)];
    }
    f.w = g.add_constant(w.name + "_scaled", std::move(scaled));
    if (f.bias != kNoValue) {
      for (size_t i = 0; i < b->size(); ++i) (*b)[i] *= (*s)[i];
      f.bias = g.add_constant(g.value(c.outputs[0]).name + "_bias", Tensor::from<float>({cn}, *b));
    }
    f.absorbed.push_back(ci);
    f.out = c.outputs[0];
    return true;
  }
  if (std::optional<ActivationSpec> a = activation_of(g, c, f.out)) {
    ActivationSpec& slot = f.z == kNoValue ? f.act : f.post;
    if (slot.kind != Activation::none || (f.z == kNoValue && f.post.kind != Activation::none)) return false;
    slot = *a;
    f.absorbed.push_back(ci);
    f.out = c.outputs[0];
    return true;
  }
  return false;
}

}  // namespace

Result<EpilogueFusions> fuse_epilogues(Graph& g) {
  std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  std::vector<char> taken(g.nodes.size(), 0);
  std::vector<Node> fused;
  EpilogueFusions stats;
  const size_t values_before = g.values.size();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (taken[i]) continue;
    std::optional<Fusion> f = start(g, i);
    if (!f) continue;
    std::vector<std::vector<Use>> uses = g.uses();  // start() may have added constants
    for (;;) {
      ActivationSpec silu{Activation::silu};
      if (auto s = silu_of(g, uses, outputs, f->out)) {
        ActivationSpec& slot = f->z == kNoValue ? f->act : f->post;
        if (slot.kind != Activation::none || (f->z == kNoValue && f->post.kind != Activation::none)) break;
        slot = silu;
        f->absorbed.push_back(s->second);
        f->absorbed.push_back(s->first);
        f->out = g.nodes[s->first].outputs[0];
        continue;
      }
      int64_t ci = single_reader(g, uses, outputs, f->out);
      if (ci < 0 || taken[static_cast<size_t>(ci)] || !absorb(g, *f, static_cast<size_t>(ci), uses, outputs)) break;
      uses = g.uses();  // absorb() may have added constants
    }
    // A lone Conv or MatMul stays what it is: fusing buys nothing without an epilogue.
    if (f->absorbed.size() == 1 && g.nodes[i].op != "Gemm") continue;
    Node n;
    const Node& root = g.nodes[i];
    n.name = root.name;
    n.op = f->conv ? "FusedConv" : "FusedMatMul";
    n.inputs = {f->x, f->w, f->bias};
    if (f->z != kNoValue) n.inputs.push_back(f->z);
    while (!n.inputs.empty() && n.inputs.back() == kNoValue) n.inputs.pop_back();
    n.outputs = {f->out};
    for (const Attribute& a : f->attrs) n.set_attr(a.name, a.value);
    write_activation(n, "activation", f->act);
    write_activation(n, "post_activation", f->post);
    for (size_t k : f->absorbed) {
      taken[k] = 1;
      const Node& src = g.nodes[k];
      if (src.sources.empty()) n.sources.push_back(src.name);
      for (const std::string& s : src.sources)
        if (std::find(n.sources.begin(), n.sources.end(), s) == n.sources.end()) n.sources.push_back(s);
    }
    stats.absorbed += f->absorbed.size() - 1;
    fused.push_back(std::move(n));
  }
  stats.fused = fused.size();
  if (fused.empty()) {
    if (g.values.size() != values_before) g.remove_dead();  // constants made for fusions that did not happen
    return stats;
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!taken[i]) kept.push_back(std::move(g.nodes[i]));
  for (Node& n : fused) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
  // The fused nodes were appended: put them back in dependence order.
  KILN_RETURN_IF_ERROR(g.topo_sort());
  g.remove_dead();
  return stats;
}

}  // namespace kiln
