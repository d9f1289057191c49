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
// rather than a stand-in for a value of an enclosing graph.
bool defined_in(const Graph& g, const std::vector<int32_t>& producers, ValueId id) {
  if (g.value(id).is_constant() || producers[static_cast<size_t>(id)] >= 0) return true;
  return std::find(g.inputs.begin(), g.inputs.end(), id) != g.inputs.end();
}

// The values `body` reads without defining them, in first-read order: node inputs, the
// captures of its own nodes (set already for nested bodies) and graph outputs.
std::vector<ValueId> free_values(const Graph& body) {
  std::vector<int32_t> prod = body.producers();
  std::vector<char> seen(body.values.size(), 0);
  std::vector<ValueId> out;
  auto read = [&](ValueId v) {
    if (v < 0 || static_cast<size_t>(v) >= body.values.size() || seen[static_cast<size_t>(v)]) return;
    seen[static_cast<size_t>(v)] = 1;
    if (!defined_in(body, prod, v)) out.push_back(v);
  };
  for (const Node& n : body.nodes) {
    for (ValueId in : n.inputs) read(in);
    for (ValueId c : n.captures) read(c);
  }
  for (ValueId o : body.outputs) read(o);
  return out;
}

// Resolves the bodies of every node of `g`, innermost first. `nested` is true for a body,
// whose unresolved names become stand-ins of its own (captured in turn by its owner).
Status resolve(Graph& g, bool nested) {
  for (Node& n : g.nodes) {
    std::vector<std::shared_ptr<Graph>*> bodies;
    for (Attribute& a : n.attrs)
      if (auto* sg = std::get_if<std::shared_ptr<Graph>>(&a.value); sg && *sg) bodies.push_back(sg);
    n.captures.clear();
    if (bodies.empty()) continue;
    std::vector<std::vector<ValueId>> reads;
    std::vector<std::string> names;  // the node's captures, by name, in first-read order
    for (std::shared_ptr<Graph>* sg : bodies) {
      KILN_RETURN_IF_ERROR(resolve(**sg, true));
      reads.push_back(free_values(**sg));
      for (ValueId v : reads.back())
        if (std::find(names.begin(), names.end(), (*sg)->value(v).name) == names.end())
          names.push_back((*sg)->value(v).name);
    }
    for (const std::string& name : names) {
      ValueId outer = g.find_value(name);
      if (outer == kNoValue) {
        if (!nested)
          return user_error(n.where(), "a subgraph reads value '" + name + "', which no enclosing graph defines");
        // A stand-in here too, so this body's owner captures it from further out.
        for (size_t b = 0; b < bodies.size() && outer == kNoValue; ++b)
          if (ValueId local = (*bodies[b])->find_value(name); local != kNoValue) {
            const Value& v = (*bodies[b])->value(local);
            outer = g.add_value(Value{v.name, v.dtype, v.shape, {}, {}});
          }
      }
      n.captures.push_back(outer);
    }
    for (size_t b = 0; b < bodies.size(); ++b) {
      Graph& body = **bodies[b];
      body.captures.assign(names.size(), kNoValue);
      for (ValueId v : reads[b]) {
        size_t pos = static_cast<size_t>(std::find(names.begin(), names.end(), body.value(v).name) - names.begin());
        body.captures[pos] = v;
      }
    }
  }
  return {};
}

}  // namespace

Status resolve_captures(Graph& graph) { return resolve(graph, false); }

std::vector<std::vector<Use>> Graph::uses() const {
  std::vector<std::vector<Use>> u(values.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (size_t i = 0; i < nodes[n].inputs.size(); ++i) {
      ValueId in = nodes[n].inputs[i];
      if (in >= 0 && static_cast<size_t>(in) < values.size()) u[static_cast<size_t>(in)].push_back(Use{n, i});
    }
    for (ValueId v : nodes[n].captures) {
      if (v < 0 || static_cast<size_t>(v) >= values.size()) continue;
      std::vector<Use>& list = u[static_cast<size_t>(v)];
      if (list.empty() || list.back() != Use{n, Use::kCaptured}) list.push_back(Use{n, Use::kCaptured});
    }
  }
  return u;
}

void Graph::replace_all_uses(ValueId from, ValueId to) {
  if (from == to) return;
  for (Node& n : nodes) {
    for (ValueId& in : n.inputs)
      if (in == from) in = to;
    for (ValueId& c : n.captures)
      if (c == from) c = to;
  }
  for (ValueId& o : outputs)
    if (o == from) o = to;
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
      // A node depends on its inputs and on the values its subgraphs capture.
      if (next < node.inputs.size() + node.captures.size()) {
        ValueId in = next < node.inputs.size() ? node.inputs[next] : node.captures[next - node.inputs.size()];
        ++next;
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
      for (ValueId c : nodes[static_cast<size_t>(p)].captures) work.push_back(c);
    }
  }
  // A subgraph's stand-ins are read through its owner's captures, not by its own nodes.
  for (ValueId c : captures)
    if (c >= 0) live_value[static_cast<size_t>(c)] = 1;
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
    for (ValueId& v : n.captures) v = remap[static_cast<size_t>(v)];
    kept_nodes.push_back(std::move(n));
  }
  for (ValueId& v : inputs) v = remap[static_cast<size_t>(v)];
  for (ValueId& v : outputs) v = remap[static_cast<size_t>(v)];
  for (ValueId& v : captures)
    if (v >= 0) v = remap[static_cast<size_t>(v)];
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
