// Dataflow queries and batched rewrites for the pattern passes (match.h).
#include "compile/passes/match.h"

#include <algorithm>
#include <cmath>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/lowp.h"

namespace kiln {

Matcher::Matcher(const Graph& g)
    : g_(g), producer_(g.producers()), uses_(g.uses()), outputs_(g.outputs.begin(), g.outputs.end()) {}

const Node* Matcher::def(ValueId v, std::string_view op) const {
  int32_t p = def_index(v);
  if (p < 0) return nullptr;
  const Node& n = g_.nodes[static_cast<size_t>(p)];
  if (!n.domain.empty() || (!op.empty() && n.op != op)) return nullptr;
  return &n;
}

bool Matcher::only_read_by(ValueId v, std::initializer_list<const Node*> readers) const {
  if (v < 0 || outputs_.count(v)) return false;
  for (const Use& u : uses_[static_cast<size_t>(v)]) {
    if (u.slot == Use::kCaptured) return false;
    if (std::none_of(readers.begin(), readers.end(), [&](const Node* r) { return r && index(*r) == u.node; })) return false;
  }
  return true;
}

const Node* Matcher::single_reader(ValueId v) const {
  if (v < 0 || outputs_.count(v)) return nullptr;
  const std::vector<Use>& u = uses_[static_cast<size_t>(v)];
  if (u.size() != 1 || u[0].slot == Use::kCaptured) return nullptr;
  const Node& n = g_.nodes[u[0].node];
  return n.domain.empty() ? &n : nullptr;
}

std::optional<float> Matcher::scalar(ValueId v) const {
  if (v < 0) return std::nullopt;
  const Value& val = g_.value(v);
  if (!val.is_constant() || val.dtype != DType::f32 || val.constant.numel() != 1) return std::nullopt;
  return val.constant.data<float>()[0];
}

bool Matcher::is_scalar(ValueId v, double want) const {
  std::optional<float> s = scalar(v);
  return s && std::abs(*s - want) <= 1e-6 * std::max(1.0, std::abs(want));
}

ValueId Matcher::other(const Node& n, ValueId v) {
  if (n.inputs.size() != 2) return kNoValue;
  if (n.inputs[0] == v && n.inputs[1] != v) return n.inputs[1];
  if (n.inputs[1] == v && n.inputs[0] != v) return n.inputs[0];
  return kNoValue;
}

std::optional<std::vector<int64_t>> Matcher::reduce_axes(const Node& n) const {
  if (n.has_attr("axes")) return n.attr_ints("axes");
  if (!n.has_input(1)) return std::nullopt;
  const Value& a = g_.value(n.inputs[1]);
  if (!a.is_constant() || a.dtype != DType::i64) return std::nullopt;
  return std::vector<int64_t>(a.constant.data<int64_t>(), a.constant.data<int64_t>() + a.constant.numel());
}

std::vector<size_t> Matcher::indices(const std::vector<const Node*>& nodes) const {
  std::vector<size_t> out;
  out.reserve(nodes.size());
  for (const Node* n : nodes) out.push_back(index(*n));
  return out;
}

void Rewrite::replace(const std::vector<size_t>& matched, Node n) {
  n.sources = merged_sources(g_, matched);
  for (size_t i : matched) remove(i);
  add(std::move(n));
}

Status Rewrite::commit() {
  if (added_.empty()) return {};
  std::vector<Node> kept;
  kept.reserve(g_.nodes.size() + added_.size());
  for (size_t i = 0; i < g_.nodes.size(); ++i)
    if (!removed_[i]) kept.push_back(std::move(g_.nodes[i]));
  for (Node& n : added_) kept.push_back(std::move(n));
  g_.nodes = std::move(kept);
  added_.clear();
  KILN_RETURN_IF_ERROR(g_.topo_sort());
  g_.remove_dead();
  removed_.assign(g_.nodes.size(), 0);
  return {};
}

std::optional<std::vector<int64_t>> int_constant(const Graph& g, ValueId v) {
  if (v == kNoValue || !g.value(v).is_constant()) return std::nullopt;
  const Tensor& t = g.value(v).constant;
  if (t.is_packed() || (t.dtype() != DType::i64 && t.dtype() != DType::i32) || t.rank() > 1) return std::nullopt;
  return t.to_int64_vector();
}

std::optional<SliceSpec> constant_slice(const Graph& g, const Node& slice) {
  if (slice.op != "Slice" || !slice.domain.empty() || slice.inputs.size() < 3) return std::nullopt;
  std::optional<std::vector<int64_t>> starts = int_constant(g, slice.inputs[1]), ends = int_constant(g, slice.inputs[2]);
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  SliceSpec s{*starts, *ends, {}, std::vector<int64_t>(starts->size(), 1)};
  for (size_t i = 0; i < starts->size(); ++i) s.axes.push_back(static_cast<int64_t>(i));
  if (slice.has_input(3)) {
    std::optional<std::vector<int64_t>> axes = int_constant(g, slice.inputs[3]);
    if (!axes || axes->size() != starts->size()) return std::nullopt;
    s.axes = *axes;
  }
  if (slice.has_input(4)) {
    std::optional<std::vector<int64_t>> steps = int_constant(g, slice.inputs[4]);
    if (!steps || steps->size() != starts->size()) return std::nullopt;
    s.steps = *steps;
  }
  return s;
}

bool per_feature(const Graph& g, ValueId v, int64_t d) {
  const Value& val = g.value(v);
  return val.is_constant() && val.dtype == DType::f32 && val.constant.shape() == std::vector<int64_t>{d};
}

bool mean_over_last(const Matcher& m, const Node* n, ValueId x) {
  if (!n || n->op != "ReduceMean" || n->inputs.empty() || n->inputs[0] != x || n->attr_int("keepdims", 1) != 1) return false;
  std::optional<std::vector<int64_t>> axes = m.reduce_axes(*n);
  const int64_t rank = m.graph().value(x).shape.rank();
  return axes && axes->size() == 1 && rank > 0 && ((*axes)[0] == -1 || (*axes)[0] == rank - 1);
}

std::vector<std::string> merged_sources(const Graph& g, const std::vector<size_t>& nodes) {
  std::vector<std::string> out;
  auto add = [&](const std::string& s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  for (size_t i : nodes) {
    const Node& n = g.nodes[i];
    if (n.sources.empty()) add(n.name);
    for (const std::string& s : n.sources) add(s);
  }
  return out;
}

bool pointwise_conv_of(const Graph& g, const Node& n, ValueId x, bool f16) {
  if (n.op != "FusedConv" || !n.domain.empty() || n.has_attr("x_parts") || nn::x_channels_first(n) || !n.has_input(0) ||
      n.inputs[0] != x || std::count(n.inputs.begin(), n.inputs.end(), x) != 1)
    return false;
  if (n.attr_int("channels_last", 0) != 1 || n.attr_int("group", 1) != 1) return false;
  for (const char* a : {"strides", "dilations"})
    for (int64_t v : n.attr_ints(a)) if (v != 1) return false;
  for (int64_t v : n.attr_ints("pads")) if (v != 0) return false;
  if (const std::string pad = n.attr_string("auto_pad", "NOTSET"); pad != "NOTSET" && pad != "VALID") return false;
  if (!n.has_input(1)) return false;
  const Value& w = g.value(n.inputs[1]);
  return w.is_constant() && (w.dtype == DType::f32 || (f16 && w.dtype == DType::f16)) && w.constant.rank() == 4 &&
         w.constant.dim(2) == 1 && w.constant.dim(3) == 1;
}

bool pointwise_fuses_in_f32(const Graph& g, const Node& n) {
  const Value& w = g.value(n.inputs[1]);
  if (w.dtype == DType::f32) return true;
  const Shape& xs = g.value(n.inputs[0]).shape;
  if (w.dtype != DType::f16 || !xs.is_concrete() || xs.rank() != 4) return false;
  const std::vector<int64_t> x = xs.concrete();
  return x[1] * x[2] > 1 && cpu::gemm::f16_pointwise_fuses(x[3], w.constant.dim(0), x[1] * x[2]);
}

}  // namespace kiln
