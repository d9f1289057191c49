// IR helpers: shapes, attributes, graph editing and ordering.
#include "formats/ir.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

std::string_view kiln_version() { return "0.1.0"; }

Shape Shape::of(std::span<const int64_t> concrete) {
  std::vector<Dim> d;
  d.reserve(concrete.size());
  for (int64_t v : concrete) d.push_back(Dim::known(v));
  return Shape(std::move(d));
}

bool Shape::is_concrete() const {
  return rank_known && std::all_of(dims.begin(), dims.end(), [](const Dim& d) { return d.is_known(); });
}

std::vector<int64_t> Shape::concrete() const {
  std::vector<int64_t> out;
  out.reserve(dims.size());
  for (const Dim& d : dims) out.push_back(d.value);
  return out;
}

std::string Shape::str() const {
  if (!rank_known) return "*";
  if (dims.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += 'x';
    if (dims[i].is_known()) s += std::to_string(dims[i].value);
    else if (dims[i].is_symbolic()) s += dims[i].symbol;
    else s += '?';
  }
  return s;
}

AttrType attr_type(const AttrValue& v) { return static_cast<AttrType>(v.index() + 1); }

std::string_view attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::int64: return "int";
    case AttrType::float64: return "float";
    case AttrType::string: return "string";
    case AttrType::ints: return "ints";
    case AttrType::floats: return "floats";
    case AttrType::strings: return "strings";
    case AttrType::tensor: return "tensor";
    case AttrType::graph: return "graph";
  }
  return "?";
}

const Attribute* Node::find_attr(std::string_view attr_name) const {
  auto it = std::lower_bound(attrs.begin(), attrs.end(), attr_name,
                             [](const Attribute& a, std::string_view n) { return a.name < n; });
  return it != attrs.end() && it->name == attr_name ? &*it : nullptr;
}

void Node::set_attr(std::string attr_name, AttrValue v) {
  auto it = std::lower_bound(attrs.begin(), attrs.end(), attr_name,
                             [](const Attribute& a, const std::string& n) { return a.name < n; });
  if (it != attrs.end() && it->name == attr_name) it->value = std::move(v);
  else attrs.insert(it, Attribute{std::move(attr_name), std::move(v)});
}

void Node::erase_attr(std::string_view attr_name) {
  std::erase_if(attrs, [&](const Attribute& a) { return a.name == attr_name; });
}

namespace {
template <class T>
const T* get_attr(const Node& n, std::string_view name) {
  const Attribute* a = n.find_attr(name);
  return a ? std::get_if<T>(&a->value) : nullptr;
}
}  // namespace

int64_t Node::attr_int(std::string_view n, int64_t def) const {
  const auto* v = get_attr<int64_t>(*this, n);
  return v ? *v : def;
}
double Node::attr_float(std::string_view n, double def) const {
  if (const auto* v = get_attr<double>(*this, n)) return *v;
  if (const auto* i = get_attr<int64_t>(*this, n)) return static_cast<double>(*i);
  return def;
}
std::string Node::attr_string(std::string_view n, std::string def) const {
  const auto* v = get_attr<std::string>(*this, n);
  return v ? *v : def;
}
std::vector<int64_t> Node::attr_ints(std::string_view n, std::vector<int64_t> def) const {
  const auto* v = get_attr<std::vector<int64_t>>(*this, n);
  return v ? *v : def;
}
std::vector<double> Node::attr_floats(std::string_view n, std::vector<double> def) const {
  const auto* v = get_attr<std::vector<double>>(*this, n);
  return v ? *v : def;
}
std::vector<std::string> Node::attr_strings(std::string_view n) const {
  const auto* v = get_attr<std::vector<std::string>>(*this, n);
  return v ? *v : std::vector<std::string>{};
}
const Tensor* Node::attr_tensor(std::string_view n) const { return get_attr<Tensor>(*this, n); }
const Graph* Node::attr_graph(std::string_view n) const {
  const auto* v = get_attr<std::shared_ptr<Graph>>(*this, n);
  return v ? v->get() : nullptr;
}

size_t Node::num_inputs() const {
  size_t n = inputs.size();
  while (n > 0 && inputs[n - 1] == kNoValue) --n;
  return n;
}

std::string Node::where() const { return "node '" + name + "'"; }

std::string Node::qualified_op() const { return domain.empty() ? op : domain + "::" + op; }

ValueId Graph::add_value(Value v) {
  values.push_back(std::move(v));
  return static_cast<ValueId>(values.size() - 1);
}

ValueId Graph::add_value(std::string name, DType dtype, Shape shape) {
  Value v;
  v.name = find_value(name) == kNoValue ? std::move(name) : unique_value_name(name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  return add_value(std::move(v));
}

ValueId Graph::add_constant(std::string name, Tensor t) {
  ValueId id = add_value(std::move(name), t.dtype(), Shape::of(t.shape()));
  value(id).constant = std::move(t);
  return id;
}

size_t Graph::add_node(Node n) {
  nodes.push_back(std::move(n));
  return nodes.size() - 1;
}

void Graph::reindex() const {
  by_name_.clear();
  indexed_ = 0;
}

ValueId Graph::find_value(std::string_view name) const {
  if (indexed_ > values.size()) reindex();  // values were removed behind the index's back
  for (; indexed_ < values.size(); ++indexed_)
    by_name_.emplace(values[indexed_].name, static_cast<ValueId>(indexed_));
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return kNoValue;
  if (values[static_cast<size_t>(it->second)].name != name) {  // renamed directly: start over
    reindex();
    return find_value(name);
  }
  return it->second;
}

std::string Graph::unique_value_name(std::string_view base) const {
  std::string b(base);
  if (find_value(b) == kNoValue) return b;
  for (int i = 1;; ++i) {
    std::string cand = b + "_" + std::to_string(i);
    if (find_value(cand) == kNoValue) return cand;
  }
}

void Graph::rename_value(ValueId id, std::string name) {
  value(id).name = std::move(name);
  reindex();  // another value may share the old name: renames are rare, rebuild on next lookup
}

std::vector<int32_t> Graph::producers() const {
  std::vector<int32_t> p(values.size(), -1);
  for (size_t n = 0; n < nodes.size(); ++n)
    for (ValueId o : nodes[n].outputs)
      if (o >= 0 && static_cast<size_t>(o) < values.size()) p[static_cast<size_t>(o)] = static_cast<int32_t>(n);
  return p;
}

namespace {

// Whether value `id` of `g` is defined there (a graph input, a constant or a node's output)
// rather than a stand-in for a value of an enclosing graph read by name.
bool defined_in(const Graph& g, const std::vector<int32_t>& producers, ValueId id) {
  if (g.value(id).is_constant() || producers[static_cast<size_t>(id)] >= 0) return true;
  return std::find(g.inputs.begin(), g.inputs.end(), id) != g.inputs.end();
}

template <class F>
void for_each_subgraph(const Node& n, F&& f) {
  for (const Attribute& a : n.attrs)
    if (const auto* sg = std::get_if<std::shared_ptr<Graph>>(&a.value)) f(**sg);
}

// The names `body` (and the bodies nested in it) read from enclosing graphs.
void free_names(const Graph& body, std::unordered_set<std::string>& out) {
  std::vector<int32_t> prod = body.producers();
  for (const Node& n : body.nodes) {
    for (ValueId in : n.inputs)
      if (in >= 0 && !defined_in(body, prod, in)) out.insert(body.value(in).name);
    for_each_subgraph(n, [&](const Graph& inner) {
      std::unordered_set<std::string> nested;
      free_names(inner, nested);
      for (const std::string& name : nested) {
        ValueId local = body.find_value(name);
        if (local == kNoValue || !defined_in(body, prod, local)) out.insert(name);
      }
    });
  }
  for (ValueId o : body.outputs)
    if (o >= 0 && !defined_in(body, prod, o)) out.insert(body.value(o).name);
}

// Points the reads of `from` in one graph at `to`: node inputs and graph outputs.
void redirect(Graph& g, ValueId from, ValueId to) {
  for (Node& n : g.nodes)
    for (ValueId& in : n.inputs)
      if (in == from) in = to;
  for (ValueId& o : g.outputs)
    if (o == from) o = to;
}

// Makes the body read the enclosing `to` wherever it reads the enclosing `from`; with `apply`
// false, only checks that it can. Bodies are shared between copies of a graph: one that
// changes is copied first, so the edit stays in this graph.
Status recapture(std::shared_ptr<Graph>& body_ptr, const std::string& from, const std::string& to, bool apply) {
  std::unordered_set<std::string> reads;
  free_names(*body_ptr, reads);
  if (!reads.count(from)) return {};
  if (apply && body_ptr.use_count() > 1) body_ptr = std::make_shared<Graph>(*body_ptr);
  Graph& body = *body_ptr;
  std::vector<int32_t> prod = body.producers();
  ValueId to_local = body.find_value(to);
  if (to_local != kNoValue && defined_in(body, prod, to_local))
    return internal_error("value '" + to + "'", "a subgraph defines its own value of this name, so it cannot read the enclosing one");
  for (Node& n : body.nodes)
    for (Attribute& a : n.attrs)
      if (auto* sg = std::get_if<std::shared_ptr<Graph>>(&a.value)) KILN_RETURN_IF_ERROR(recapture(*sg, from, to, apply));
  if (!apply) return {};
  ValueId from_local = body.find_value(from);
  if (from_local == kNoValue || defined_in(body, prod, from_local)) return {};
  if (to_local != kNoValue) redirect(body, from_local, to_local);  // already reads `to`: merge
  else body.rename_value(from_local, to);
  return {};
}

}  // namespace

std::vector<std::vector<Use>> Graph::uses() const {
  std::vector<std::vector<Use>> u(values.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (size_t i = 0; i < nodes[n].inputs.size(); ++i) {
      ValueId in = nodes[n].inputs[i];
      if (in >= 0 && static_cast<size_t>(in) < values.size()) u[static_cast<size_t>(in)].push_back(Use{n, i});
    }
    for (ValueId v : captures(n)) u[static_cast<size_t>(v)].push_back(Use{n, Use::kCaptured});
  }
  return u;
}

std::vector<ValueId> Graph::captures(size_t node) const {
  std::unordered_set<std::string> reads;
  for_each_subgraph(nodes[node], [&](const Graph& body) { free_names(body, reads); });
  std::vector<ValueId> captured;
  for (const std::string& name : reads)
    if (ValueId v = find_value(name); v != kNoValue) captured.push_back(v);
  std::sort(captured.begin(), captured.end());
  return captured;
}

Status Graph::replace_all_uses(ValueId from, ValueId to) {
  if (from == to) return {};
  const std::string from_name = value(from).name, to_name = value(to).name;
  for (bool apply : {false, true})
    for (Node& n : nodes)
      for (Attribute& a : n.attrs)
        if (auto* sg = std::get_if<std::shared_ptr<Graph>>(&a.value))
          KILN_RETURN_IF_ERROR(recapture(*sg, from_name, to_name, apply));
  redirect(*this, from, to);
  return {};
}

Status Graph::topo_sort() {
  std::vector<int32_t> prod = producers();
  std::vector<int> state(nodes.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<size_t> order;
  order.reserve(nodes.size());
  // Iterative DFS in node order, so an already-sorted graph keeps its order.
  for (size_t root = 0; root < nodes.size(); ++root) {
    if (state[root]) continue;
    std::vector<std::pair<size_t, size_t>> stack{{root, 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      const Node& node = nodes[n];
      if (next < node.inputs.size()) {
        ValueId in = node.inputs[next++];
        if (in < 0 || static_cast<size_t>(in) >= prod.size()) continue;
        int32_t p = prod[static_cast<size_t>(in)];
        if (p < 0) continue;
        if (state[static_cast<size_t>(p)] == 1)
          return user_error(nodes[static_cast<size_t>(p)].where(),
                            "the graph has a cycle through value '" + values[static_cast<size_t>(in)].name + "'");
        if (state[static_cast<size_t>(p)] == 0) {
          state[static_cast<size_t>(p)] = 1;
          stack.emplace_back(static_cast<size_t>(p), 0);
        }
        continue;
      }
      state[n] = 2;
      order.push_back(n);
      stack.pop_back();
    }
  }
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  for (size_t i : order) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
  return {};
}

void Graph::remove_dead() {
  std::vector<int32_t> prod = producers();
  std::vector<char> live_value(values.size(), 0), live_node(nodes.size(), 0);
  std::vector<ValueId> work(outputs.begin(), outputs.end());
  while (!work.empty()) {
    ValueId v = work.back();
    work.pop_back();
    if (v < 0 || live_value[static_cast<size_t>(v)]) continue;
    live_value[static_cast<size_t>(v)] = 1;
    int32_t p = prod[static_cast<size_t>(v)];
    if (p >= 0 && !live_node[static_cast<size_t>(p)]) {
      live_node[static_cast<size_t>(p)] = 1;
      for (ValueId in : nodes[static_cast<size_t>(p)].inputs) work.push_back(in);
      for (ValueId o : nodes[static_cast<size_t>(p)].outputs)
        if (o >= 0) live_value[static_cast<size_t>(o)] = 1;
      // Subgraphs read enclosing values by name: keep those alive too.
      for (const Attribute& a : nodes[static_cast<size_t>(p)].attrs)
        if (const auto* g = std::get_if<std::shared_ptr<Graph>>(&a.value)) {
          std::vector<const Graph*> todo{g->get()};
          while (!todo.empty()) {
            const Graph* sg = todo.back();
            todo.pop_back();
            for (const Node& sn : sg->nodes) {
              for (ValueId in : sn.inputs)
                if (in >= 0) {
                  ValueId outer = find_value(sg->value(in).name);
                  if (outer >= 0) work.push_back(outer);
                }
              for (const Attribute& sa : sn.attrs)
                if (const auto* sgg = std::get_if<std::shared_ptr<Graph>>(&sa.value)) todo.push_back(sgg->get());
            }
          }
        }
    }
  }
  for (ValueId v : inputs) live_value[static_cast<size_t>(v)] = 1;
  // Renumber values and drop dead nodes.
  std::vector<ValueId> remap(values.size(), kNoValue);
  std::vector<Value> kept;
  for (size_t i = 0; i < values.size(); ++i)
    if (live_value[i]) {
      remap[i] = static_cast<ValueId>(kept.size());
      kept.push_back(std::move(values[i]));
    }
  std::vector<Node> kept_nodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!live_node[i]) continue;
    Node n = std::move(nodes[i]);
    for (ValueId& v : n.inputs) if (v >= 0) v = remap[static_cast<size_t>(v)];
    for (ValueId& v : n.outputs) if (v >= 0) v = remap[static_cast<size_t>(v)];
    kept_nodes.push_back(std::move(n));
  }
  for (ValueId& v : inputs) v = remap[static_cast<size_t>(v)];
  for (ValueId& v : outputs) v = remap[static_cast<size_t>(v)];
  values = std::move(kept);
  nodes = std::move(kept_nodes);
  reindex();
}

std::string_view stage_name(Stage s) {
  switch (s) {
    case Stage::exported: return "exported";
    case Stage::quantized: return "quantized";
    case Stage::compiled: return "compiled";
  }
  return "unknown";
}

}  // namespace kiln
