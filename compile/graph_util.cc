// Shared graph edits for the passes.
#include "compile/graph_util.h"

#include <algorithm>
#include <string>

#include "runtime/session.h"

namespace kiln {

void erase_nodes(Graph& graph, const std::vector<char>& drop) {
  std::vector<Node> kept;
  kept.reserve(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (i >= drop.size() || !drop[i]) kept.push_back(std::move(graph.nodes[i]));
  graph.nodes = std::move(kept);
}

size_t drop_unused_values(Graph& graph) {
  const size_t nv = graph.values.size();
  std::vector<char> used(nv, 0);
  for (ValueId v : graph.inputs) used[static_cast<size_t>(v)] = 1;
  for (ValueId v : graph.outputs) used[static_cast<size_t>(v)] = 1;
  for (ValueId v : graph.captures)
    if (v >= 0) used[static_cast<size_t>(v)] = 1;
  for (const Node& n : graph.nodes)
    for (ValueId v : n.outputs)
      if (v >= 0) used[static_cast<size_t>(v)] = 1;
  std::vector<std::vector<Use>> uses = graph.uses();
  for (size_t v = 0; v < nv; ++v)
    if (!uses[v].empty()) used[v] = 1;
  size_t dropped = 0;
  for (char u : used) dropped += !u;
  if (dropped == 0) return 0;

  std::vector<ValueId> remap(nv, kNoValue);
  // A fresh Graph rebuilds its private name index on the first lookup; editing `values` in
  // place would leave the old graph's index pointing at the wrong values.
  Graph out;
  out.values.reserve(nv - dropped);
  for (size_t v = 0; v < nv; ++v)
    if (used[v]) {
      remap[v] = static_cast<ValueId>(out.values.size());
      out.values.push_back(std::move(graph.values[v]));
    }
  auto map = [&](ValueId& v) {
    if (v >= 0) v = remap[static_cast<size_t>(v)];
  };
  out.nodes = std::move(graph.nodes);
  for (Node& n : out.nodes) {
    for (ValueId& v : n.inputs) map(v);
    for (ValueId& v : n.outputs) map(v);
    for (ValueId& v : n.captures) map(v);
  }
  out.inputs = std::move(graph.inputs);
  out.outputs = std::move(graph.outputs);
  out.captures = std::move(graph.captures);
  for (ValueId& v : out.inputs) map(v);
  for (ValueId& v : out.outputs) map(v);
  for (ValueId& v : out.captures) map(v);
  graph = std::move(out);
  return dropped;
}

std::optional<std::string> concrete_input_shapes(const Graph& graph, std::vector<std::vector<int64_t>>& shapes) {
  shapes.clear();
  for (ValueId in : graph.inputs) {
    const Value& v = graph.value(in);
    if (!v.shape.is_concrete()) return "input '" + v.name + "' has shape " + v.shape.str();
    shapes.push_back(v.shape.concrete());
  }
  return std::nullopt;
}

std::vector<size_t> reader_counts(const Graph& graph) {
  std::vector<std::vector<Use>> uses = graph.uses();
  std::vector<size_t> count(graph.values.size(), 0);
  for (size_t v = 0; v < uses.size(); ++v) count[v] = uses[v].size();
  for (ValueId v : graph.outputs) ++count[static_cast<size_t>(v)];
  return count;
}

bool is_scalar_constant(const Graph& g, const Node& n, size_t slot) {
  return n.has_input(slot) && g.value(n.inputs[slot]).is_constant() && g.value(n.inputs[slot]).constant.numel() == 1;
}

bool per_tensor(const Graph& g, const Node& n, std::string_view op) {
  return n.op == op && n.domain.empty() && n.inputs.size() == 3 && is_scalar_constant(g, n, 1) && is_scalar_constant(g, n, 2) &&
         g.value(n.inputs[1]).dtype == DType::f32 && !n.has_attr("block_size") && n.attr_string("precision", "").empty() &&
         n.attr_string("output_dtype", "f32") == "f32";
}

std::string count_of(size_t n, const char* singular, const char* plural) {
  return std::to_string(n) + " " + (n == 1 ? singular : plural);
}

Result<std::vector<Tensor>> evaluate_nodes(const Graph& graph, const std::vector<size_t>& nodes,
                                           const std::vector<ValueId>& outputs) {
  Model model;
  Graph& sub = model.graph;
  for (size_t i : nodes) {
    Node copy = graph.nodes[i];
    for (ValueId& in : copy.inputs) {
      if (in < 0) continue;
      const Value& v = graph.value(in);
      const ValueId local = sub.find_value(v.name);
      in = local != kNoValue ? local : sub.add_constant(v.name, v.constant);
    }
    // Shapes are left to the session's inference: the stored ones may still be symbolic.
    for (ValueId& out : copy.outputs)
      if (out >= 0) out = sub.add_value(graph.value(out).name, graph.value(out).dtype, Shape::unknown_rank());
    copy.kernel = {};
    sub.add_node(std::move(copy));
  }
  for (ValueId o : outputs) sub.outputs.push_back(sub.find_value(graph.value(o).name));
  SessionOptions options;
  options.reference = true;
  KILN_ASSIGN_OR_RETURN(auto session, Session::create(model, options));
  return session->run(std::vector<Tensor>{});
}

std::optional<std::vector<size_t>> constant_cone(const Graph& graph, ValueId value) {
  const std::vector<int32_t> producer = graph.producers();
  std::vector<char> in_cone(graph.nodes.size(), 0);
  std::vector<ValueId> todo = {value};
  while (!todo.empty()) {
    const ValueId v = todo.back();
    todo.pop_back();
    if (v < 0 || graph.value(v).is_constant()) continue;
    const int32_t p = producer[static_cast<size_t>(v)];
    if (p < 0) return std::nullopt;  // a graph input (or a subgraph's stand-in)
    if (in_cone[static_cast<size_t>(p)]) continue;
    const Node& n = graph.nodes[static_cast<size_t>(p)];
    if (!n.domain.empty() || !n.captures.empty()) return std::nullopt;
    for (const Attribute& a : n.attrs)
      if (std::holds_alternative<std::shared_ptr<Graph>>(a.value)) return std::nullopt;
    in_cone[static_cast<size_t>(p)] = 1;
    todo.insert(todo.end(), n.inputs.begin(), n.inputs.end());
  }
  std::vector<size_t> nodes;
  for (size_t i = 0; i < in_cone.size(); ++i)
    if (in_cone[i]) nodes.push_back(i);
  if (nodes.empty()) return std::nullopt;
  return nodes;
}

Result<size_t> fold_constant_dequantize(Graph& g) {
  std::vector<char> drop(g.nodes.size(), 0);
  size_t n = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& d = g.nodes[i];
    if (d.op != "DequantizeLinear" || !d.domain.empty() || d.outputs.size() != 1) continue;
    bool constant = true;
    for (ValueId v : d.inputs) constant = constant && (v == kNoValue || g.value(v).is_constant());
    if (!constant) continue;
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> r, evaluate_nodes(g, {i}, {d.outputs[0]}));
    g.value(d.outputs[0]).constant = r[0];
    drop[i] = 1;
    ++n;
  }
  if (n) {
    erase_nodes(g, drop);
    drop_unused_values(g);
  }
  return n;
}

Result<size_t> fold_computed_weights(Graph& g) {
  const std::vector<int32_t> producer = g.producers();
  std::vector<char> drop(g.nodes.size(), 0), in_cone(g.nodes.size(), 0);
  size_t n = 0;
  for (const Node& reader : g.nodes) {
    const std::string& op = reader.op;
    if (!reader.domain.empty() || !reader.has_input(1) ||
        (op != "Conv" && op != "ConvTranspose" && op != "MatMul" && op != "Gemm"))
      continue;
    const ValueId w = reader.inputs[1];
    std::optional<std::vector<size_t>> cone = constant_cone(g, w);  // nullopt once w is folded
    if (!cone) continue;
    Result<std::vector<Tensor>> r = evaluate_nodes(g, *cone, {w});
    if (!r.ok() && r.error().kind == ErrorKind::user) continue;
    if (!r.ok()) return r.error();
    g.value(w).constant = (*r)[0];
    drop[static_cast<size_t>(producer[static_cast<size_t>(w)])] = 1;
    for (size_t i : *cone) in_cone[i] = 1;
    ++n;
  }
  if (n == 0) return n;
  // The rest of each cone goes where nothing else reads it (last first: a node's readers come
  // after it).
  const std::vector<std::vector<Use>> uses = g.uses();
  std::vector<char> graph_output(g.values.size(), 0);
  for (ValueId o : g.outputs) graph_output[static_cast<size_t>(o)] = 1;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    if (!in_cone[i] || drop[i]) continue;
    bool read = false;
    for (ValueId o : g.nodes[i].outputs) {
      if (o < 0) continue;
      read = read || graph_output[static_cast<size_t>(o)];
      for (const Use& u : uses[static_cast<size_t>(o)]) read = read || !drop[u.node];
    }
    drop[i] = !read;
  }
  erase_nodes(g, drop);
  drop_unused_values(g);
  return n;
}

}  // namespace kiln
