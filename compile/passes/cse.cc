// cse: common-subexpression elimination. Constants with the same dtype, shape and bytes become
// one; then, in node order, a node with the same op, domain, attributes and inputs as an
// earlier one is dropped and its readers read the earlier node's outputs. Walking in order
// merges whole chains in one pass: once two nodes are merged, their readers have equal inputs.
//
// Never merged: ops outside the core set (nothing says they are pure; kiln's core ops are,
// see fold_constants.cc), nodes with subgraph attributes (two bodies are never compared), and a
// node or constant that is a graph output (its name is part of the model's interface). Values
// subgraphs capture merge like any other: replace_all_uses moves the captures.
#include <bit>
#include <cstring>
#include <functional>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "compile/graph_util.h"
#include "compile/pass.h"

namespace kiln {

namespace {

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Exact equality: floats compare by their bits (0.0 and -0.0 differ, NaN equals itself), so
// merged nodes compute bit for bit the same thing.
bool same_attr(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&b](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if constexpr (std::is_same_v<T, double>) {
          return std::bit_cast<uint64_t>(x) == std::bit_cast<uint64_t>(y);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          return same_tensor(x, y);
        } else if constexpr (std::is_same_v<T, std::shared_ptr<Graph>>) {
          return false;  // bodies are never compared (mergeable() keeps such nodes out anyway)
        } else {
          return x == y;
        }
      },
      a);
}

bool same_node(const Node& a, const Node& b) {
  if (a.op != b.op || a.domain != b.domain || a.inputs != b.inputs || a.outputs.size() != b.outputs.size() ||
      a.attrs.size() != b.attrs.size() || !(a.kernel == b.kernel))
    return false;
  for (size_t i = 0; i < a.outputs.size(); ++i)
    if ((a.outputs[i] < 0) != (b.outputs[i] < 0)) return false;
  for (size_t i = 0; i < a.attrs.size(); ++i)
    if (a.attrs[i].name != b.attrs[i].name || !same_attr(a.attrs[i].value, b.attrs[i].value)) return false;
  return true;
}

size_t mix(size_t h, size_t x) { return h ^ (x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

// Of a large constant, 4 KiB at its start, middle and end (the bytes are compared where the
// hashes meet): hashing all of them took BERT-base's 438 MB of weights 0.18 s a compile.
size_t tensor_hash(const Tensor& t) {
  constexpr size_t kPiece = 4096;
  const auto* bytes = static_cast<const char*>(t.raw());
  const size_t n = t.nbytes();
  size_t h = 0;
  if (n <= 3 * kPiece) {
    h = std::hash<std::string_view>{}(std::string_view(bytes, n));
  } else {
    for (size_t at : {size_t{0}, (n - kPiece) / 2, n - kPiece})
      h = mix(h, std::hash<std::string_view>{}(std::string_view(bytes + at, kPiece)));
  }
  h = mix(h, static_cast<size_t>(t.dtype()));
  for (int64_t d : t.shape()) h = mix(h, static_cast<size_t>(d));
  return h;
}

// Op and inputs only: attributes are compared when the hashes meet.
size_t node_hash(const Node& n) {
  size_t h = mix(std::hash<std::string>{}(n.op), std::hash<std::string>{}(n.domain));
  for (ValueId v : n.inputs) h = mix(h, static_cast<size_t>(v + 1));
  return h;
}

bool mergeable(const Node& n) {
  if (!n.domain.empty()) return false;
  for (const Attribute& a : n.attrs)
    if (std::holds_alternative<std::shared_ptr<Graph>>(a.value)) return false;
  return true;
}

}  // namespace

Result<PassResult> eliminate_common_subexpressions(Model& model, PassContext&) {
  Graph& g = model.graph;
  // Values that must keep their own name: graph outputs. Merging only redirects readers to
  // earlier values, never away from these.
  std::vector<char> this_only(g.values.size(), 0);
  for (ValueId v : g.outputs) this_only[static_cast<size_t>(v)] = 1;

  size_t merged_constants = 0;
  std::unordered_multimap<size_t, ValueId> constants;
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (!g.values[v].is_constant()) continue;
    const size_t h = tensor_hash(g.values[v].constant);
    ValueId keep = kNoValue;
    for (auto [it, end] = constants.equal_range(h); it != end && keep == kNoValue; ++it)
      if (same_tensor(g.value(it->second).constant, g.values[v].constant) && g.value(it->second).quant == g.values[v].quant)
        keep = it->second;
    if (keep == kNoValue || this_only[v]) {
      constants.emplace(h, static_cast<ValueId>(v));
      continue;
    }
    g.replace_all_uses(static_cast<ValueId>(v), keep);
    ++merged_constants;
  }

  size_t merged_nodes = 0;
  std::vector<char> dropped(g.nodes.size(), 0);
  std::unordered_multimap<size_t, size_t> seen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!mergeable(n)) continue;
    const size_t h = node_hash(n);
    size_t keep = SIZE_MAX;
    for (auto [it, end] = seen.equal_range(h); it != end && keep == SIZE_MAX; ++it)
      if (same_node(g.nodes[it->second], n)) keep = it->second;
    bool pinned = false;
    for (ValueId o : n.outputs) pinned = pinned || (o >= 0 && this_only[static_cast<size_t>(o)]);
    if (keep == SIZE_MAX || pinned) {
      seen.emplace(h, i);
      continue;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (n.outputs[k] >= 0) g.replace_all_uses(n.outputs[k], g.nodes[keep].outputs[k]);
    std::vector<std::string> sources = g.nodes[i].sources;
    for (std::string& s : sources) g.nodes[keep].sources.push_back(std::move(s));
    dropped[i] = 1;
    ++merged_nodes;
  }
  if (merged_constants == 0 && merged_nodes == 0) return PassResult{};
  erase_nodes(g, dropped);
  drop_unused_values(g);
  std::string summary = "merged ";
  if (merged_nodes) summary += count_of(merged_nodes, "duplicate node", "duplicate nodes");
  if (merged_nodes && merged_constants) summary += " and ";
  if (merged_constants) summary += count_of(merged_constants, "duplicate constant", "duplicate constants");
  return PassResult{true, summary};
}

}  // namespace kiln
