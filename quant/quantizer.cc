// The built-in quantizers' patterns on kiln's exported graphs. PT2E sees `linear` and `conv2d`;
// kiln's exporter writes a linear layer as MatMul by a constant [K, N] weight (then an Add of a
// constant [N] bias) or as Gemm, and a convolution as Conv: those are the anchors here.
#include "quant/quantizer.h"

#include <algorithm>
#include <map>
#include <set>

#include "compile/passes/patterns.h"

namespace kiln::quant {

namespace {

// Producers and readers of every value.
struct Uses {
  explicit Uses(const Graph& g) : producer(g.values.size(), -1), readers(g.values.size()), is_output(g.values.size(), false) {
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      for (ValueId v : g.nodes[n].outputs)
        if (v != kNoValue) producer[static_cast<size_t>(v)] = static_cast<int64_t>(n);
      for (size_t i = 0; i < g.nodes[n].inputs.size(); ++i)
        if (g.nodes[n].inputs[i] != kNoValue) readers[static_cast<size_t>(g.nodes[n].inputs[i])].push_back(n);
    }
    for (ValueId v : g.outputs) is_output[static_cast<size_t>(v)] = true;
  }
  /// The one node that reads node n's output 0, when exactly one does and it is no graph output.
  std::optional<size_t> only_reader(const Graph& g, size_t n) const {
    const Node& node = g.nodes[n];
    if (node.outputs.empty() || node.outputs[0] == kNoValue) return std::nullopt;
    const size_t v = static_cast<size_t>(node.outputs[0]);
    if (readers[v].size() != 1 || is_output[v]) return std::nullopt;
    return readers[v][0];
  }
  std::vector<int64_t> producer;
  std::vector<std::vector<size_t>> readers;
  std::vector<bool> is_output;
};

bool is_constant(const Graph& g, const Node& n, size_t slot) { return n.has_input(slot) && g.value(n.inputs[slot]).is_constant(); }

bool is_float_value(const Graph& g, ValueId v) { return v != kNoValue && is_float(g.value(v).dtype); }

// The output-channel axis of a linear or conv node's constant weight; nullopt when the node is
// no such layer.
std::optional<int64_t> weight_axis(const Graph& g, const Node& n) {
  if (n.op == "Conv" && is_constant(g, n, 1)) return 0;
  if (n.op == "MatMul" && is_constant(g, n, 1) && g.value(n.inputs[1]).constant.rank() == 2) return 1;
  if (n.op == "Gemm" && is_constant(g, n, 1) && n.attr_int("transA", 0) == 0)
    return n.attr_int("transB", 0) ? 0 : 1;
  return std::nullopt;
}

// A MatMul's bias: the Add of a constant vector that alone reads its output.
std::optional<size_t> bias_add(const Graph& g, const Uses& u, size_t n) {
  if (g.nodes[n].op != "MatMul") return std::nullopt;
  auto next = u.only_reader(g, n);
  if (!next) return std::nullopt;
  const Node& add = g.nodes[*next];
  if (add.op != "Add" || add.num_inputs() != 2) return std::nullopt;
  const int other = add.inputs[0] == g.nodes[n].outputs[0] ? 1 : 0;
  if (!is_constant(g, add, static_cast<size_t>(other)) || g.value(add.inputs[static_cast<size_t>(other)]).constant.rank() > 1)
    return std::nullopt;
  return *next;
}

// x · Sigmoid(x) written out (SiLU, as exporters write it) after node n: its Sigmoid and Mul,
// when they alone read n's output 0 (no graph output) and the Mul alone reads the Sigmoid's.
std::optional<std::pair<size_t, size_t>> silu_after(const Graph& g, const Uses& u, size_t n) {
  const Node& node = g.nodes[n];
  if (node.outputs.empty() || node.outputs[0] == kNoValue) return std::nullopt;
  const ValueId x = node.outputs[0];
  const std::vector<size_t>& readers = u.readers[static_cast<size_t>(x)];
  if (readers.size() != 2 || u.is_output[static_cast<size_t>(x)]) return std::nullopt;
  for (int first = 0; first < 2; ++first) {
    const size_t sig = readers[static_cast<size_t>(first)], mul = readers[static_cast<size_t>(1 - first)];
    const Node& s = g.nodes[sig];
    const Node& m = g.nodes[mul];
    if (s.op != "Sigmoid" || !s.domain.empty() || s.inputs[0] != x || m.op != "Mul" || !m.domain.empty() || m.num_inputs() != 2) continue;
    if (u.only_reader(g, sig) != mul) continue;
    const ValueId y = s.outputs[0];
    if ((m.inputs[0] == x && m.inputs[1] == y) || (m.inputs[0] == y && m.inputs[1] == x)) return std::pair{sig, mul};
  }
  return std::nullopt;
}

struct Style {
  std::string name;
  QuantConfig config;
  std::set<std::string> conv_activations, linear_activations;
  bool binary_after_layer;  ///< x86: conv / linear + add (+ relu) as one pattern
  std::set<std::string> propagate;  ///< ops whose output shares their input 0's spec
  bool propagate_needs_quantized_inputs;  ///< x86: only when every input comes from a quantized pattern
};

class PatternQuantizer final : public Quantizer {
 public:
  PatternQuantizer(Style style, NodeFilter filter) : s_(std::move(style)), allowed_(std::move(filter)) {}
  std::string name() const override { return s_.name; }

  Status annotate(const Graph& g, Annotations& out) const override {
    Uses u(g);
    if (s_.config.activation.is_dynamic) {  // linear layers alone: input quantized at run time, output float
      for (size_t n = 0; n < g.nodes.size(); ++n) dynamic_linear(g, u, n, out);
      return {};
    }
    // GELUs written out, by their input: a linear layer takes one after it as its activation
    // (as Inductor's x86 quantizer annotates linear + GELU as one), so no Q/DQ pair splits them.
    std::map<ValueId, GeluChain> gelus;
    if (s_.linear_activations.count("Gelu"))
      for (GeluChain& c : find_gelus(g)) gelus.emplace(c.x, std::move(c));
    // Layers with their fusions first, then the lone layers, as PT2E orders its annotators.
    for (size_t n = 0; n < g.nodes.size(); ++n) layer(g, u, gelus, n, out);
    if (s_.name == "xnnpack")
      for (size_t n = 0; n < g.nodes.size(); ++n) binary(g, u, n, out);
    for (size_t n = 0; n < g.nodes.size(); ++n) propagated(g, u, n, out);
    return {};
  }

 private:
  bool allowed(size_t n) const { return !allowed_ || allowed_(n); }
  bool free(const Annotations& out, std::initializer_list<size_t> nodes) const {
    for (size_t n : nodes)
      if (out.count(n)) return false;
    return true;
  }
  NodeAnnotation mark(const std::string& pattern, size_t anchor) const {
    NodeAnnotation a;
    a.anchor = anchor;
    a.quantizer = s_.name;
    a.pattern = pattern;
    return a;
  }

  // conv / linear, its bias Add, then (x86) + Add (+ Relu), or + one activation (for a linear
  // layer, a GELU written out counts as one; for a convolution, x86, a SiLU written out).
  void layer(const Graph& g, const Uses& u, const std::map<ValueId, GeluChain>& gelus, size_t n, Annotations& out) const {
    const Node& node = g.nodes[n];
    auto axis = weight_axis(g, node);
    if (!axis || !is_float_value(g, node.inputs[0]) || out.count(n) || !allowed(n)) return;
    const bool conv = node.op == "Conv";
    std::vector<size_t> chain = {n};
    if (auto b = bias_add(g, u, n); b && allowed(*b)) chain.push_back(*b);
    if (!free(out, {chain.back()})) return;
    std::string pattern = conv ? "conv" : "linear";
    std::optional<size_t> residual;
    int residual_slot = 0;  // the Add's input that is not the layer's output
    // A linear layer's output may pass a Reshape on its way (GPT-2's layers multiply 2-D rows and
    // give them their 3-D shape back: Reshape(Gemm(Reshape(x)))); the Reshape joins the pattern
    // when what follows it does.
    std::optional<size_t> view;
    auto next = u.only_reader(g, chain.back());
    if (next && !conv && g.nodes[*next].op == "Reshape" && g.nodes[*next].domain.empty() &&
        g.nodes[*next].inputs[0] == g.nodes[chain.back()].outputs[0] && !out.count(*next) && allowed(*next)) {
      view = next;
      next = u.only_reader(g, *view);
    }
    const size_t last = view ? *view : chain.back();  // the node whose output the rest reads
    if (next && !allowed(*next)) next.reset();
    if (next && s_.binary_after_layer && g.nodes[*next].op == "Add" && g.nodes[*next].num_inputs() == 2 && !out.count(*next)) {
      const Node& add = g.nodes[*next];
      const int other = add.inputs[0] == g.nodes[last].outputs[0] ? 1 : 0;
      if (!is_constant(g, add, static_cast<size_t>(other)) && is_float_value(g, add.inputs[static_cast<size_t>(other)])) {
        if (view) chain.push_back(*view);
        chain.push_back(*next);
        residual = *next;
        residual_slot = other;
        pattern += "_add";
        auto relu = u.only_reader(g, *next);
        if (relu && g.nodes[*relu].op == "Relu" && !out.count(*relu) && allowed(*relu)) chain.push_back(*relu), pattern += "_relu";
      }
    } else if (auto silu = conv && !view && s_.conv_activations.count("Silu") ? silu_after(g, u, last) : std::nullopt;
               silu && free(out, {silu->first, silu->second}) && allowed(silu->first) && allowed(silu->second)) {
      chain.insert(chain.end(), {silu->first, silu->second});  // the Mul writes the SiLU
      pattern += "_Silu";
      // x86: and an Add after it (a YOLO bottleneck's shortcut), which compile's FusedConv
      // takes as its residual after the activation.
      if (auto add = s_.binary_after_layer ? u.only_reader(g, silu->second) : std::nullopt;
          add && g.nodes[*add].op == "Add" && g.nodes[*add].domain.empty() && g.nodes[*add].num_inputs() == 2 && !out.count(*add) &&
          allowed(*add)) {
        const Node& a = g.nodes[*add];
        const int other = a.inputs[0] == g.nodes[silu->second].outputs[0] ? 1 : 0;
        if (!is_constant(g, a, static_cast<size_t>(other)) && is_float_value(g, a.inputs[static_cast<size_t>(other)])) {
          chain.push_back(*add);
          residual = *add;
          residual_slot = other;
          pattern += "_add";
        }
      }
    } else if (next && !out.count(*next) && (conv ? s_.conv_activations : s_.linear_activations).count(g.nodes[*next].op)) {
      if (view) chain.push_back(*view);
      chain.push_back(*next);
      pattern += "_" + g.nodes[*next].op;
    } else if (auto gelu = gelus.find(g.nodes[last].outputs[0]); !conv && gelu != gelus.end() &&
               std::none_of(gelu->second.nodes.begin(), gelu->second.nodes.end(), [&](size_t c) { return out.count(c) || !allowed(c); })) {
      if (view) chain.push_back(*view);
      chain.insert(chain.end(), gelu->second.nodes.begin(), gelu->second.nodes.end());  // the last one writes the GELU
      pattern += "_Gelu";
    }
    QuantSpec weight = s_.config.weight;
    weight.ch_axis = weight.per_channel() ? *axis : 0;
    NodeAnnotation head = mark(pattern, n);
    head.inputs[0] = s_.config.activation;
    head.inputs[1] = weight;
    for (size_t c : chain) out[c] = mark(pattern, n);
    out[n] = head;
    if (residual) out[*residual].inputs[residual_slot] = s_.config.activation;
    out[chain.back()].output = s_.config.activation;
  }

  // Dynamic: a linear layer (and its bias Add) with its input quantized at run time from the
  // data's range, its weight as in the static config, its output float (PT2E's dynamic configs).
  void dynamic_linear(const Graph& g, const Uses& u, size_t n, Annotations& out) const {
    const Node& node = g.nodes[n];
    if (node.op == "Conv" || out.count(n) || !allowed(n)) return;
    auto axis = weight_axis(g, node);
    if (!axis || !is_float_value(g, node.inputs[0])) return;
    NodeAnnotation head = mark("linear_dynamic", n);
    head.inputs[0] = s_.config.activation;
    QuantSpec weight = s_.config.weight;
    weight.ch_axis = weight.per_channel() ? *axis : 0;
    head.inputs[1] = weight;
    out[n] = head;
    if (auto b = bias_add(g, u, n); b && allowed(*b) && !out.count(*b)) out[*b] = mark("linear_dynamic", n);
  }

  // xnnpack: Add and Mul (+ Relu) of two float tensors, quantized on both sides.
  void binary(const Graph& g, const Uses& u, size_t n, Annotations& out) const {
    const Node& node = g.nodes[n];
    if ((node.op != "Add" && node.op != "Mul") || node.num_inputs() != 2 || out.count(n) || !allowed(n)) return;
    NodeAnnotation a = mark(node.op == "Add" ? "add" : "mul", n);
    for (int i = 0; i < 2; ++i) {
      const ValueId v = node.inputs[static_cast<size_t>(i)];
      if (!is_float_value(g, v)) continue;
      const Tensor& c = g.value(v).constant;
      // A scalar too large for the histogram stays float (PT2E's HISTC_UPPER_BOUND).
      if (c.defined() && c.numel() == 1 && c.dtype() == DType::f32 && std::abs(c.data<float>()[0]) > 3.4028235e15f) continue;
      a.inputs[i] = s_.config.activation;
    }
    if (a.inputs.empty()) return;
    auto relu = u.only_reader(g, n);
    if (relu && g.nodes[*relu].op == "Relu" && !out.count(*relu) && allowed(*relu)) {
      a.pattern += "_relu";
      NodeAnnotation r = mark(a.pattern, n);
      r.output = s_.config.activation;
      out[*relu] = r;
    } else {
      a.output = s_.config.activation;
    }
    out[n] = a;
  }

  // Pooling, shape ops, Concat and Split keep their input's quantization: the output shares
  // input 0's spec (Concat: every input shares input 0's too; Split: every piece).
  void propagated(const Graph& g, const Uses& u, size_t n, Annotations& out) const {
    const Node& node = g.nodes[n];
    if (!s_.propagate.count(node.op) || out.count(n) || node.inputs.empty() || !is_float_value(g, node.inputs[0]) || !allowed(n)) return;
    const bool concat = node.op == "Concat";
    const size_t data_inputs = concat ? node.inputs.size() : 1;
    auto quantized_output = [&](ValueId v) {  // v is an output its producer's annotation quantizes
      const int64_t p = u.producer[static_cast<size_t>(v)];
      if (p < 0 || !out.count(static_cast<size_t>(p))) return false;
      const NodeAnnotation& a = out.at(static_cast<size_t>(p));
      const std::vector<ValueId>& outs = g.nodes[static_cast<size_t>(p)].outputs;
      const size_t k = static_cast<size_t>(std::find(outs.begin(), outs.end(), v) - outs.begin());
      return k == 0 ? a.output.has_value() : a.later_outputs.count(k) > 0;
    };
    if (s_.propagate_needs_quantized_inputs || !concat) {
      for (size_t i = 0; i < data_inputs; ++i)
        if (node.inputs[i] == kNoValue || !quantized_output(node.inputs[i])) return;
    }
    NodeAnnotation a = mark("shared: " + node.op, n);
    a.inputs[0] = s_.config.activation;
    for (size_t i = 1; i < data_inputs; ++i) a.inputs[static_cast<int>(i)] = SharedSpec{Edge{n, 0}};
    a.output = SharedSpec{Edge{n, 0}};
    for (size_t k = 1; k < node.outputs.size(); ++k)
      if (node.outputs[k] != kNoValue) a.later_outputs[k] = SharedSpec{Edge{n, 0}};
    out[n] = a;
  }

  Style s_;
  NodeFilter allowed_;  ///< empty: every node
};

// Weight-only: each linear layer's constant weight, nothing else.
class WeightOnlyQuantizer final : public Quantizer {
 public:
  WeightOnlyQuantizer(int bits, int64_t group_size, NodeFilter filter)
      : bits_(bits), group_size_(group_size), allowed_(std::move(filter)) {}
  std::string name() const override {
    return "weight-only int" + std::to_string(bits_) +
           (group_size_ ? " (groups of " + std::to_string(group_size_) + ")" : " (per channel)");
  }
  Status annotate(const Graph& g, Annotations& out) const override {
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      const Node& node = g.nodes[n];
      if (node.op == "Conv" || out.count(n) || (allowed_ && !allowed_(n))) continue;
      auto axis = weight_axis(g, node);
      if (!axis || !is_float_value(g, node.inputs[0])) continue;
      QuantSpec w = weight_only_spec(bits_, group_size_);
      // Per channel: the scales follow the output channels; in groups: blocks along K.
      w.ch_axis = group_size_ ? 1 - *axis : *axis;
      NodeAnnotation a;
      a.anchor = n;
      a.quantizer = "weight_only";
      a.pattern = "linear_weight_only";
      a.inputs[1] = w;
      out[n] = a;
    }
    return {};
  }

 private:
  int bits_;
  int64_t group_size_;
  NodeFilter allowed_;
};

}  // namespace

QuantSpec weight_only_spec(int bits, int64_t group_size) {
  QuantSpec w = bits == 4 ? QuantSpec{DType::u4, 0, 15, QScheme::per_channel_affine, 0, ObserverKind::per_channel_min_max}
                          : QuantSpec{DType::i8, -128, 127, QScheme::per_channel_symmetric, 0, ObserverKind::per_channel_min_max};
  w.block_size = group_size;
  return w;
}

std::unique_ptr<Quantizer> make_weight_only_quantizer(int bits, int64_t group_size, NodeFilter filter) {
  if ((bits != 8 && bits != 4) || group_size < 0) return nullptr;
  return std::make_unique<WeightOnlyQuantizer>(bits, group_size, std::move(filter));
}

QuantConfig x86_config(bool dynamic) {
  QuantConfig c;
  c.activation = QuantSpec{DType::u8, 0, 255, QScheme::per_tensor_affine, 0, ObserverKind::histogram};
  if (dynamic) {
    c.activation.observer = ObserverKind::placeholder;
    c.activation.is_dynamic = true;
  }
  c.weight = QuantSpec{DType::i8, -128, 127, QScheme::per_channel_symmetric, 0, ObserverKind::per_channel_min_max};
  return c;
}

QuantConfig xnnpack_config(bool per_channel) {
  QuantConfig c;
  c.activation = QuantSpec{DType::i8, -128, 127, QScheme::per_tensor_affine, 0, ObserverKind::histogram};
  c.weight = per_channel ? QuantSpec{DType::i8, -127, 127, QScheme::per_channel_symmetric, 0, ObserverKind::per_channel_min_max}
                         : QuantSpec{DType::i8, -127, 127, QScheme::per_tensor_symmetric, 0, ObserverKind::min_max};
  return c;
}

std::unique_ptr<Quantizer> make_quantizer(const std::string& name, bool per_channel, NodeFilter filter, bool dynamic) {
  if (name == "x86")
    return std::make_unique<PatternQuantizer>(Style{"x86", x86_config(dynamic), {"Relu", "Clip", "HardSwish", "Silu"},
                                                    {"Relu", "LeakyRelu", "Tanh", "Gelu"}, true,
                                                    {"MaxPool", "AveragePool", "GlobalAveragePool", "Concat", "Flatten", "Split", "Resize"}, true},
                                              std::move(filter));
  if (name == "xnnpack" && !dynamic)
    return std::make_unique<PatternQuantizer>(Style{"xnnpack", xnnpack_config(per_channel), {"Relu"}, {"Relu"}, false,
                                                    {"Relu", "Clip", "MaxPool", "ReduceMean", "Transpose", "Squeeze",
                                                     "Reshape", "Slice", "Flatten", "GlobalAveragePool", "Concat"},
                                                    false},
                                              std::move(filter));
  return nullptr;
}

std::string ComposableQuantizer::name() const {
  std::string s;
  for (const auto& p : parts_) {
    if (!s.empty()) s += '+';
    s += p->name();
  }
  return s;
}

Status ComposableQuantizer::annotate(const Graph& graph, Annotations& out) const {
  for (const auto& p : parts_) KILN_RETURN_IF_ERROR(p->annotate(graph, out));
  return {};
}

}  // namespace kiln::quant
