// Shared graph edits for the passes.
#include "compile/graph_util.h"

#include <string>

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

std::string count_of(size_t n, const char* singular, const char* plural) {
  return std::to_string(n) + " " + (n == 1 ? singular : plural);
}

}  // namespace kiln
