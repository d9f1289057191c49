// Dataflow queries and batched rewrites for the pattern passes (match.h).
#include "compile/passes/match.h"

#include <algorithm>
#include <cmath>

#include "compile/graph_util.h"
#include "formats/ops/nn_util.h"
#include "formats/ops/shape_util.h"
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

namespace {

std::optional<std::vector<DimTerm>> dim_terms_at(const Matcher& m, ValueId v, int depth) {
  const Graph& g = m.graph();
  const Value& val = g.value(v);
  if ((val.dtype != DType::i64 && val.dtype != DType::i32) || !val.shape.rank_known || val.shape.rank() > 1 || depth > 32)
    return std::nullopt;
  std::vector<DimTerm> terms;
  if (val.is_constant()) {
    if (val.constant.is_packed() || val.constant.numel() > kFoldLimit) return std::nullopt;
    for (int64_t e : val.constant.to_int64_vector()) terms.push_back({e});
    return terms;
  }
  const Node* n = m.def(v);
  if (!n || !n->domain.empty()) return std::nullopt;
  if (n->op == "Shape") {
    const Shape& x = g.value(n->inputs[0]).shape;
    if (!x.rank_known) return std::nullopt;
    const int64_t rank = x.rank();
    const auto clamp = [rank](int64_t a) { return std::clamp(a < 0 ? a + rank : a, int64_t{0}, rank); };
    for (int64_t d = clamp(n->attr_int("start", 0)); d < clamp(n->attr_int("end", rank)); ++d) {
      const Dim& dim = x.dims[static_cast<size_t>(d)];
      terms.push_back(dim.is_known() ? DimTerm{dim.value} : DimTerm{0, n->inputs[0], d});
    }
    return terms;
  }
  if (n->op == "Identity" || n->op == "Cast" || n->op == "Unsqueeze" || n->op == "Squeeze") return dim_terms_at(m, n->inputs[0], depth + 1);
  if (n->op == "Concat") {
    for (ValueId in : n->inputs) {
      std::optional<std::vector<DimTerm>> part = dim_terms_at(m, in, depth + 1);
      if (!part) return std::nullopt;
      terms.insert(terms.end(), part->begin(), part->end());
    }
    return terms;
  }
  std::optional<std::vector<DimTerm>> data = n->inputs.empty() ? std::nullopt : dim_terms_at(m, n->inputs[0], depth + 1);
  if (!data || g.value(n->inputs[0]).shape.rank() != 1) return std::nullopt;
  const auto size = static_cast<int64_t>(data->size());
  if (n->op == "Gather") {
    std::optional<std::vector<int64_t>> at = n->inputs.size() == 2 ? int_constant(g, n->inputs[1]) : std::nullopt;
    if (!at || n->attr_int("axis", 0) != 0) return std::nullopt;
    for (int64_t i : *at) {
      if (i < -size || i >= size) return std::nullopt;
      terms.push_back((*data)[static_cast<size_t>(i < 0 ? i + size : i)]);
    }
    return terms;
  }
  if (n->op == "Slice") {
    const std::optional<SliceSpec> spec = constant_slice(g, *n);
    if (!spec || spec->starts.size() != 1 || spec->steps[0] != 1 || (spec->axes[0] != 0 && spec->axes[0] != -1)) return std::nullopt;
    const auto clamp = [size](int64_t a) { return std::clamp(a < 0 ? a + size : a, int64_t{0}, size); };
    for (int64_t i = clamp(spec->starts[0]); i < clamp(spec->ends[0]); ++i) terms.push_back((*data)[static_cast<size_t>(i)]);
    return terms;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::vector<DimTerm>> dim_terms(const Matcher& m, ValueId v) { return dim_terms_at(m, v, 0); }

std::optional<DimTerm> range_length(const Matcher& m, const Node& range) {
  const Graph& g = m.graph();
  if (range.op != "Range" || !range.domain.empty() || range.inputs.size() != 3 || int_constant(g, range.inputs[0]) != std::vector<int64_t>{0} ||
      int_constant(g, range.inputs[2]) != std::vector<int64_t>{1})
    return std::nullopt;
  const std::optional<std::vector<DimTerm>> t = dim_terms(m, range.inputs[1]);
  if (!t || t->size() != 1 || (*t)[0].of == kNoValue) return std::nullopt;
  return (*t)[0];
}

ValueId shape_origin(const Matcher& m, ValueId v) {
  for (int depth = 0; depth < 16; ++depth) {
    const Node* n = m.def(v);
    if (!n || n->inputs.empty() || n->inputs[0] == kNoValue ||
        (n->op != "QuantizeLinear" && n->op != "DequantizeLinear" && n->op != "Cast" && n->op != "Identity"))
      break;
    v = n->inputs[0];
  }
  return v;
}

bool same_dim(const Matcher& m, ValueId of, int64_t axis, ValueId x, size_t d) {
  const Shape& xs = m.graph().value(x).shape;
  if (!xs.rank_known || d >= xs.dims.size()) return false;
  if (axis == static_cast<int64_t>(d) && shape_origin(m, of) == shape_origin(m, x)) return true;
  const Shape& os = m.graph().value(of).shape;
  return os.rank_known && axis < os.rank() && os.dims[static_cast<size_t>(axis)].is_symbolic() && os.dims[static_cast<size_t>(axis)] == xs.dims[d];
}

void erase_dead_shape_arithmetic(Graph& g) {
  for (bool dropped = true; dropped;) {
    const std::vector<std::vector<Use>> uses = g.uses();
    const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
    std::vector<char> dead(g.nodes.size(), 0);
    dropped = false;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      static const std::set<std::string_view> kShapeOps = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Identity"};
      if (!n.domain.empty() || !kShapeOps.count(n.op) || n.outputs.size() != 1 || n.outputs[0] == kNoValue) continue;
      const ValueId o = n.outputs[0];
      if (uses[static_cast<size_t>(o)].empty() && !outputs.count(o) && g.value(o).shape.rank() <= 1 &&
          (g.value(o).dtype == DType::i64 || g.value(o).dtype == DType::i32))
        dead[i] = 1, dropped = true;
    }
    if (dropped) erase_nodes(g, dead);
  }
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
