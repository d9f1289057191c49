// Semantic verification of models (see verify.h for the list of rules). Runs on every load and
// after export and passes, so its messages are written for users: they name the value or node
// and give the concrete numbers.
#include "formats/verify.h"

#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "formats/memory.h"
#include "formats/op_schema.h"

namespace kiln {
namespace {

using NameMap = std::unordered_map<std::string_view, ValueId>;

/// Whether two shapes can describe the same tensor: unknown rank, unknown and symbolic dims
/// match anything.
bool compatible(const Shape& a, const Shape& b) {
  if (!a.rank_known || !b.rank_known) return true;
  if (a.dims.size() != b.dims.size()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (a.dims[i].is_known() && b.dims[i].is_known() && a.dims[i].value != b.dims[i].value) return false;
  return true;
}

/// The range of an integer storage type, clamped to int64.
std::pair<int64_t, int64_t> int_range(DType t) {
  switch (t) {
    case DType::i8: return {INT8_MIN, INT8_MAX};
    case DType::u8: return {0, UINT8_MAX};
    case DType::i16: return {INT16_MIN, INT16_MAX};
    case DType::u16: return {0, UINT16_MAX};
    case DType::i32: return {INT32_MIN, INT32_MAX};
    case DType::u32: return {0, UINT32_MAX};
    case DType::u64: return {0, std::numeric_limits<int64_t>::max()};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

/// Checks that a tensor's data is consistent with its dtype and shape.
Status check_tensor(const Tensor& t, const std::string& where) {
  if (!dtype_valid(static_cast<uint16_t>(t.dtype())))
    return user_error(where, "data has unknown dtype " + std::to_string(static_cast<uint16_t>(t.dtype())));
  for (int64_t d : t.shape())
    if (d < 0) return user_error(where, "data shape has negative dim " + std::to_string(d));
  const std::optional<size_t> bytes = storage_bytes(t.dtype(), shape_numel(t.shape()));
  if (!bytes || *bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max()))
    return user_error(where, "data shape " + shape_str(t.shape()) + " has more elements than fit in memory");
  if (*bytes > 0 && t.raw() == nullptr) return user_error(where, "data of " + shape_str(t.shape()) + " is missing");
  return {};
}

/// A value's shape fits kiln's limits: rank at most kMaxRank, and when every dim is known, a
/// byte count that neither overflows nor passes the memory limit (`--max-memory`).
Status check_shape_size(const Value& v, const std::string& where) {
  if (v.shape.rank() > kMaxRank)
    return user_error(where, "shape has rank " + std::to_string(v.shape.rank()) + "; kiln supports ranks up to " + std::to_string(kMaxRank));
  if (!v.shape.is_concrete() || !dtype_valid(static_cast<uint16_t>(v.dtype))) return {};
  std::optional<size_t> bytes = storage_bytes(v.dtype, shape_numel(v.shape.concrete()));
  if (!bytes) return user_error(where, "shape " + v.shape.str() + " has more elements than fit in memory");
  if (*bytes > memory_limit())
    return user_error(where, "shape " + v.shape.str() + " (" + std::string(dtype_name(v.dtype)) + ") needs " +
                                 format_bytes(*bytes) + ", past the memory limit of " + format_bytes(memory_limit()) +
                                 " (--max-memory)");
  return {};
}

Status check_quant(const Value& v, const std::string& where) {
  const QuantParams& q = *v.quant;
  auto raw = static_cast<uint16_t>(q.storage);
  if (!dtype_valid(raw)) return user_error(where, "quant storage has unknown dtype " + std::to_string(raw));
  if (!is_integer(q.storage))
    return user_error(where, "quant storage dtype " + std::string(dtype_name(q.storage)) + " is not an integer type");
  size_t n = q.scales.size();
  if (n == 0) return user_error(where, "quant params have no scales");
  if (q.zero_points.size() != n)
    return user_error(where, "quant params have " + std::to_string(n) + " scales but " +
                                 std::to_string(q.zero_points.size()) + " zero points");
  if (q.axis < 0) {
    if (n != 1)
      return user_error(where, "per-tensor quant params have " + std::to_string(n) + " scales");
  } else if (v.shape.rank_known) {
    if (q.axis >= v.shape.rank())
      return user_error(where, "quant axis " + std::to_string(q.axis) + " is out of range for shape " + v.shape.str());
    const Dim& d = v.shape.dims[static_cast<size_t>(q.axis)];
    if (d.is_known() && d.value != static_cast<int64_t>(n))
      return user_error(where, "quant params have " + std::to_string(n) + " scales but dim " +
                                   std::to_string(q.axis) + " of shape " + v.shape.str() + " has " + std::to_string(d.value));
  }
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(q.scales[i]) || !(q.scales[i] > 0))
      return user_error(where, "quant scale " + std::to_string(i) + " is " + std::to_string(q.scales[i]) +
                                   "; scales must be positive and finite");
  auto [lo, hi] = int_range(q.storage);
  for (size_t i = 0; i < n; ++i)
    if (q.zero_points[i] < lo || q.zero_points[i] > hi)
      return user_error(where, "quant zero point " + std::to_string(i) + " is " + std::to_string(q.zero_points[i]) +
                                   ", outside the range of " + std::string(dtype_name(q.storage)));
  return {};
}

/// Verifies one graph; each subgraph gets its own verifier with its enclosing graph and the
/// node that owns it, against which its captures are checked.
class GraphVerifier {
 public:
  GraphVerifier(const Graph& g, std::string prefix, const Graph* enclosing = nullptr, const Node* owner = nullptr)
      : g_(g), prefix_(std::move(prefix)), enclosing_(enclosing), owner_(owner) {}

  Status run() {
    KILN_RETURN_IF_ERROR(check_values());
    KILN_RETURN_IF_ERROR(check_graph_inputs());
    KILN_RETURN_IF_ERROR(check_nodes());
    KILN_RETURN_IF_ERROR(check_captures());
    KILN_RETURN_IF_ERROR(check_graph_outputs());
    KILN_RETURN_IF_ERROR(check_sources());
    KILN_RETURN_IF_ERROR(check_acyclic());
    KILN_RETURN_IF_ERROR(check_subgraphs());
    return check_inference();
  }

 private:
  Error err(const std::string& where, std::string what) const { return user_error(prefix_ + where, std::move(what)); }
  /// Where an error about the graph as a whole goes: the holding node and attribute, if any.
  Error graph_err(std::string what) const {
    std::string w = prefix_;
    if (w.size() >= 2) w.resize(w.size() - 2);  // drop the trailing ": "
    return user_error(std::move(w), std::move(what));
  }
  Status prefixed(Status s) const {
    if (!s.ok()) s.error().where = prefix_ + s.error().where;
    return s;
  }
  size_t n() const { return g_.values.size(); }
  bool in_range(ValueId id) const { return id >= 0 && static_cast<size_t>(id) < n(); }
  std::string vname(ValueId id) const { return "'" + g_.value(id).name + "'"; }
  std::string range_what(const std::string& what, ValueId id) const {
    return what + " refers to value " + std::to_string(id) + " but the graph has " + std::to_string(n()) + " values";
  }

  Status check_values() {
    names_.reserve(n());
    for (size_t i = 0; i < n(); ++i) {
      const Value& v = g_.values[i];
      if (v.name.empty()) return err("value " + std::to_string(i), "the value has no name");
      std::string w = "value '" + v.name + "'";
      auto [it, inserted] = names_.emplace(v.name, static_cast<ValueId>(i));
      if (!inserted)
        return err(w, "the name is used by both value " + std::to_string(it->second) + " and value " + std::to_string(i));
      auto raw = static_cast<uint16_t>(v.dtype);
      if (raw == 0) return err(w, "the value has no dtype");
      if (!dtype_valid(raw)) return err(w, "unknown dtype " + std::to_string(raw));
      if (!v.shape.rank_known && !v.shape.dims.empty())
        return err(w, "shape has unknown rank but lists " + std::to_string(v.shape.dims.size()) + " dims");
      KILN_RETURN_IF_ERROR(prefixed(check_shape_size(v, w)));
      if (v.is_constant()) {
        KILN_RETURN_IF_ERROR(prefixed(check_tensor(v.constant, w)));
        if (v.constant.dtype() != v.dtype)
          return err(w, "dtype is " + std::string(dtype_name(v.dtype)) + " but its data is " +
                            std::string(dtype_name(v.constant.dtype())));
        if (!compatible(v.shape, Shape::of(v.constant.shape())))
          return err(w, "shape is " + v.shape.str() + " but its data is " + shape_str(v.constant.shape()));
      }
      if (v.quant) KILN_RETURN_IF_ERROR(prefixed(check_quant(v, w)));
    }
    return {};
  }

  Status check_graph_inputs() {
    is_input_.assign(n(), 0);
    for (size_t k = 0; k < g_.inputs.size(); ++k) {
      ValueId id = g_.inputs[k];
      if (!in_range(id)) return graph_err(range_what("graph input " + std::to_string(k), id));
      std::string w = "value " + vname(id);
      if (is_input_[static_cast<size_t>(id)]) return err(w, "the value is listed twice as a graph input");
      if (g_.value(id).is_constant()) return err(w, "the value is both a graph input and a constant");
      is_input_[static_cast<size_t>(id)] = 1;
    }
    return {};
  }

  Status check_nodes() {
    producer_.assign(n(), -1);
    for (size_t ni = 0; ni < g_.nodes.size(); ++ni) {
      const Node& node = g_.nodes[ni];
      std::string w = node.where();
      if (node.op.empty()) return err(w, "the node has no op");
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        ValueId id = node.inputs[i];
        if (id != kNoValue && !in_range(id)) return err(w, range_what("input " + std::to_string(i), id));
      }
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        ValueId id = node.outputs[i];
        if (id == kNoValue) continue;
        std::string out = "output " + std::to_string(i);
        if (!in_range(id)) return err(w, range_what(out, id));
        out += " " + vname(id);
        int32_t& p = producer_[static_cast<size_t>(id)];
        if (p == static_cast<int32_t>(ni)) return err(w, out + " is listed twice among the node's outputs");
        if (p >= 0) return err(w, out + " is also produced by " + g_.nodes[static_cast<size_t>(p)].where());
        if (is_input_[static_cast<size_t>(id)]) return err(w, out + " is a graph input");
        if (g_.value(id).is_constant()) return err(w, out + " is a constant");
        p = static_cast<int32_t>(ni);
      }
      std::unordered_set<std::string_view> attr_names;
      for (const Attribute& a : node.attrs) {
        std::string aw = w + ": attribute '" + a.name + "'";
        if (!attr_names.insert(a.name).second) return err(w, "attribute '" + a.name + "' appears twice");
        if (const auto* t = std::get_if<Tensor>(&a.value)) {
          if (!t->defined()) return err(aw, "the attribute holds no tensor");
          KILN_RETURN_IF_ERROR(prefixed(check_tensor(*t, aw)));
        } else if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a.value)) {
          if (!*sub) return err(aw, "the attribute holds no graph");
          subgraphs_.push_back({sub->get(), aw + ": ", &node});
        }
      }
      for (size_t i = 0; i < node.captures.size(); ++i)
        if (!in_range(node.captures[i]))
          return err(w, range_what("captured value " + std::to_string(i), node.captures[i]));
      if (node.domain.empty()) {
        const OpSchema* schema = core_ops().find("", node.op);
        if (!schema) return err(w, "unknown op '" + node.op + "'");
        KILN_RETURN_IF_ERROR(prefixed(check_node_schema(node, *schema)));
      }
    }
    return {};
  }

  Status check_graph_outputs() {
    for (size_t k = 0; k < g_.outputs.size(); ++k)
      if (!in_range(g_.outputs[k]))
        return graph_err(range_what("graph output " + std::to_string(k), g_.outputs[k]));
    return {};
  }

  /// A subgraph's stand-ins for the values its owner captures: each one neither an input, a
  /// constant nor a node output, listed once, of the captured value's dtype.
  Status check_captures() {
    is_capture_.assign(n(), 0);
    size_t expected = owner_ ? owner_->captures.size() : 0;
    if (g_.captures.size() != expected)
      return graph_err(owner_ ? "the subgraph binds " + std::to_string(g_.captures.size()) +
                                    " captured values but its node captures " + std::to_string(expected)
                              : "a top-level graph cannot capture values");
    for (size_t k = 0; k < g_.captures.size(); ++k) {
      ValueId id = g_.captures[k];
      if (id == kNoValue) continue;
      if (!in_range(id)) return graph_err(range_what("captured value " + std::to_string(k), id));
      auto i = static_cast<size_t>(id);
      std::string w = "value " + vname(id);
      if (is_capture_[i]) return err(w, "the value stands for two captured values");
      if (producer_[i] >= 0 || is_input_[i] || g_.values[i].is_constant())
        return err(w, "the value stands for a captured value but is also defined in the subgraph");
      const Value& outer = enclosing_->value(owner_->captures[k]);
      if (outer.dtype != g_.values[i].dtype)
        return err(w, "the value is " + std::string(dtype_name(g_.values[i].dtype)) + " but stands for '" +
                          outer.name + "', which is " + std::string(dtype_name(outer.dtype)));
      is_capture_[i] = 1;
    }
    return {};
  }

  bool has_source(ValueId id) const {
    auto i = static_cast<size_t>(id);
    return producer_[i] >= 0 || is_input_[i] || g_.values[i].is_constant() || is_capture_[i];
  }

  std::string no_source() const {
    return owner_ ? " has no source: no node produces it and it is not a graph input, a constant or a captured "
                    "value of the enclosing graph"
                  : " has no source: no node produces it and it is not a graph input or a constant";
  }

  Status check_sources() {
    for (const Node& node : g_.nodes)
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        ValueId id = node.inputs[i];
        if (id != kNoValue && !has_source(id))
          return err(node.where(), "input " + std::to_string(i) + " " + vname(id) + no_source());
      }
    for (size_t k = 0; k < g_.outputs.size(); ++k)
      if (!has_source(g_.outputs[k]))
        return graph_err("graph output " + std::to_string(k) + " " + vname(g_.outputs[k]) + no_source());
    return {};
  }

  Status check_acyclic() const {
    // Iterative depth-first search over producer edges; a node met again while still on the
    // stack closes a cycle.
    std::vector<uint8_t> state(g_.nodes.size(), 0);  // 0 new, 1 on the stack, 2 done
    for (size_t root = 0; root < g_.nodes.size(); ++root) {
      if (state[root]) continue;
      std::vector<std::pair<size_t, size_t>> stack{{root, 0}};
      state[root] = 1;
      while (!stack.empty()) {
        auto& [ni, next] = stack.back();
        const Node& node = g_.nodes[ni];
        // A node depends on its inputs and on the values its subgraphs capture.
        if (next == node.inputs.size() + node.captures.size()) {
          state[ni] = 2;
          stack.pop_back();
          continue;
        }
        ValueId in = next < node.inputs.size() ? node.inputs[next] : node.captures[next - node.inputs.size()];
        ++next;
        if (in == kNoValue) continue;
        int32_t p = producer_[static_cast<size_t>(in)];
        if (p < 0) continue;
        auto pi = static_cast<size_t>(p);
        if (state[pi] == 1) return err(g_.nodes[pi].where(), "the graph has a cycle through value " + vname(in));
        if (state[pi] == 0) {
          state[pi] = 1;
          stack.emplace_back(pi, 0);
        }
      }
    }
    return {};
  }

  Status check_subgraphs() const {
    for (const auto& [sub, prefix, owner] : subgraphs_)
      KILN_RETURN_IF_ERROR(GraphVerifier(*sub, prefix_ + prefix, &g_, owner).run());
    return {};
  }

  Status check_inference() const {
    for (const Node& node : g_.nodes) {
      if (!node.domain.empty()) continue;
      const OpSchema* schema = core_ops().find("", node.op);
      if (!schema || !schema->infer) continue;
      auto inferred = infer_node(node, g_);
      if (!inferred.ok()) return prefixed(inferred.status());
      for (size_t i = 0; i < node.outputs.size() && i < inferred->size(); ++i) {
        ValueId id = node.outputs[i];
        if (id == kNoValue) continue;
        const Value& v = g_.value(id);
        const InferOutput& o = (*inferred)[i];
        std::string out = "output " + std::to_string(i) + " " + vname(id);
        if (o.dtype != DType::undefined && o.dtype != v.dtype)
          return err(node.where(), out + " has dtype " + std::string(dtype_name(v.dtype)) + " but " + node.op +
                                       " gives " + std::string(dtype_name(o.dtype)));
        if (!compatible(o.shape, v.shape))
          return err(node.where(), out + " has shape " + v.shape.str() + " but " + node.op + " gives " + o.shape.str());
      }
    }
    return {};
  }

  const Graph& g_;
  std::string prefix_;  ///< "" or "node 'if_1': attribute 'then_branch': "
  const Graph* enclosing_;
  const Node* owner_;
  NameMap names_;
  std::vector<uint8_t> is_input_;
  std::vector<uint8_t> is_capture_;
  std::vector<int32_t> producer_;
  struct Subgraph {
    const Graph* graph;
    std::string prefix;
    const Node* owner;
  };
  std::vector<Subgraph> subgraphs_;
};

}  // namespace

Status verify_graph(const Graph& graph) { return GraphVerifier(graph, "").run(); }

Status verify_model(const Model& model) {
  auto raw = static_cast<uint16_t>(model.stage);
  if (raw < static_cast<uint16_t>(Stage::exported) || raw > static_cast<uint16_t>(Stage::compiled))
    return user_error("", "unknown model stage " + std::to_string(raw));
  KILN_RETURN_IF_ERROR(verify_graph(model.graph));
  const Graph& g = model.graph;
  if (const TargetRecord* t = model.target ? &*model.target : nullptr) {
    if (t->device.empty()) return user_error("target", "the target names no device");
    if (t->threads < 1 || t->threads > kMaxThreads)
      return user_error("target", "the target's thread count " + std::to_string(t->threads) + " is not from 1 to " +
                                      std::to_string(kMaxThreads));
  }
  if (const MemoryPlanRecord* mp = model.memory_plan ? &*model.memory_plan : nullptr) {
    if (mp->input_shapes.size() != g.inputs.size())
      return user_error("memory plan", "it lists " + std::to_string(mp->input_shapes.size()) +
                                           " input shapes but the graph has " + std::to_string(g.inputs.size()) + " inputs");
    for (const MemoryPlanRecord::Placement& p : mp->values) {
      if (p.value < 0 || static_cast<size_t>(p.value) >= g.values.size())
        return user_error("memory plan", "it places value " + std::to_string(p.value) + " but the graph has " +
                                             std::to_string(g.values.size()) + " values");
      if (p.offset > mp->arena_bytes || p.bytes > mp->arena_bytes - p.offset)
        return user_error("memory plan", "value '" + g.value(p.value).name + "' at offset " + std::to_string(p.offset) + " (" +
                                             std::to_string(p.bytes) + " bytes) lies outside the arena of " +
                                             std::to_string(mp->arena_bytes) + " bytes");
    }
  }
  return {};
}

}  // namespace kiln
