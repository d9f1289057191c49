#include "quant/prepare.h"

#include <algorithm>
#include <numeric>

namespace kiln::quant {

namespace {

bool same_spec(const QuantSpec& a, const QuantSpec& b) {
  return a.dtype == b.dtype && a.qmin == b.qmin && a.qmax == b.qmax && a.qscheme == b.qscheme && a.ch_axis == b.ch_axis &&
         a.observer == b.observer && a.eps == b.eps && a.averaging_constant == b.averaging_constant &&
         a.is_dynamic == b.is_dynamic;
}

std::string edge_name(const Graph& g, const Edge& e) {
  const Node& n = g.nodes[e.node];
  if (!e.is_output()) return n.where() + " input " + std::to_string(e.input);
  return n.where() + " output" + (e.output_index() ? " " + std::to_string(e.output_index()) : "");
}

// Union-find over edge indices.
struct Sets {
  explicit Sets(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), size_t{0}); }
  size_t find(size_t i) { return parent[i] == i ? i : parent[i] = find(parent[i]); }
  void join(size_t a, size_t b) { parent[find(a)] = find(b); }
  std::vector<size_t> parent;
};

}  // namespace

ValueId edge_value(const Graph& g, const Edge& e) {
  const Node& n = g.nodes[e.node];
  if (e.is_output()) return e.output_index() < n.outputs.size() ? n.outputs[e.output_index()] : kNoValue;
  return static_cast<size_t>(e.input) < n.inputs.size() ? n.inputs[static_cast<size_t>(e.input)] : kNoValue;
}

Result<Prepared> prepare(const Graph& g, const Annotations& annotations) {
  // Every annotated edge, with its spec.
  std::vector<Edge> edges;
  std::vector<const EdgeSpec*> specs;
  std::map<Edge, size_t> index;
  for (const auto& [n, a] : annotations) {
    for (const auto& [slot, spec] : a.inputs) {
      index[Edge{n, slot}] = edges.size();
      edges.push_back(Edge{n, slot});
      specs.push_back(&spec);
    }
    if (a.output) {
      index[Edge{n, Edge::kOutput}] = edges.size();
      edges.push_back(Edge{n, Edge::kOutput});
      specs.push_back(&*a.output);
    }
    for (const auto& [k, spec] : a.later_outputs) {
      index[Edge::output(n, k)] = edges.size();
      edges.push_back(Edge::output(n, k));
      specs.push_back(&spec);
    }
  }
  for (const Edge& e : edges)
    if (edge_value(g, e) == kNoValue) return Error{ErrorKind::internal, "", "", "annotation of " + edge_name(g, e) + ", which is absent"};
  Sets sets(edges.size());
  for (size_t i = 0; i < edges.size(); ++i)
    if (const auto* shared = std::get_if<SharedSpec>(specs[i])) {
      auto it = index.find(shared->with);
      if (it == index.end())
        return Error{ErrorKind::internal, "", "", edge_name(g, edges[i]) + " shares with " + edge_name(g, shared->with) + ", which has no annotation"};
      sets.join(i, it->second);
    }
  // The QuantSpec of each set so far (its members that carry one directly), for implicit sharing.
  auto set_spec = [&](size_t i) -> const QuantSpec* {
    const size_t root = sets.find(i);
    for (size_t k = 0; k < edges.size(); ++k)
      if (sets.find(k) == root)
        if (const auto* q = std::get_if<QuantSpec>(specs[k])) return q;
    return nullptr;
  };
  std::vector<int64_t> producer(g.values.size(), -1);
  std::vector<size_t> slot(g.values.size(), 0);  // which of its producer's outputs a value is
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (size_t k = 0; k < g.nodes[n].outputs.size(); ++k)
      if (const ValueId v = g.nodes[n].outputs[k]; v != kNoValue) {
        producer[static_cast<size_t>(v)] = static_cast<int64_t>(n);
        slot[static_cast<size_t>(v)] = k;
      }
  for (size_t i = 0; i < edges.size(); ++i) {
    const Edge& e = edges[i];
    if (e.is_output() || !annotations.at(e.node).allow_implicit_sharing) continue;
    const size_t v = static_cast<size_t>(edge_value(g, e));
    const int64_t p = producer[v];
    if (p < 0 || !annotations.count(static_cast<size_t>(p)) || !annotations.at(static_cast<size_t>(p)).allow_implicit_sharing) continue;
    auto out = index.find(Edge::output(static_cast<size_t>(p), slot[v]));
    if (out == index.end()) continue;
    const QuantSpec* a = set_spec(i);
    const QuantSpec* b = set_spec(out->second);
    if (a && b && same_spec(*a, *b)) sets.join(i, out->second);
  }

  Prepared prepared;
  std::map<size_t, size_t> group_of_root;
  std::vector<char> has_spec;  // per group: a member carried a QuantSpec of its own
  for (size_t i = 0; i < edges.size(); ++i) {
    const size_t root = sets.find(i);
    auto [it, fresh] = group_of_root.emplace(root, prepared.groups.size());
    if (fresh) prepared.groups.emplace_back(), has_spec.push_back(0);
    ObserverGroup& group = prepared.groups[it->second];
    group.edges.push_back(edges[i]);
    prepared.group_of[edges[i]] = it->second;
    if (const auto* q = std::get_if<QuantSpec>(specs[i])) {
      if (has_spec[it->second] && !same_spec(group.spec, *q))
        return Error{ErrorKind::internal, "", "", edge_name(g, edges[i]) + " must share parameters with edges of another spec"};
      group.spec = *q;
      has_spec[it->second] = 1;
    } else if (const auto* f = std::get_if<FixedSpec>(specs[i])) {
      group.fixed = *f;
      group.spec = f->spec;
    } else if (const auto* d = std::get_if<DerivedSpec>(specs[i])) {
      group.derived = *d;
      group.spec = d->spec;
    }
  }
  for (size_t gi = 0; gi < prepared.groups.size(); ++gi) {
    ObserverGroup& group = prepared.groups[gi];
    if (group.fixed || group.derived || group.spec.is_dynamic) continue;
    KILN_RETURN_IF_ERROR(validate(group.spec, edge_name(g, group.edges[0])));
    group.observer = make_observer(group.spec);
    for (const Edge& e : group.edges) {
      const ValueId v = edge_value(g, e);
      const Value& value = g.value(v);
      if (value.is_constant()) {
        // Weights: known now, observed once.
        if (Status s = group.observer->observe(value.constant); !s.ok())
          return user_error(edge_name(g, e), "value '" + value.name + "': " + s.error().what);
        continue;
      }
      auto& feeds = prepared.watch[v];
      if (std::find(feeds.begin(), feeds.end(), gi) == feeds.end()) feeds.push_back(gi);
    }
  }
  return prepared;
}

void Calibrator::feed(ValueId v, const Tensor& t) {
  auto it = prepared_.watch.find(v);
  if (it == prepared_.watch.end()) return;
  for (size_t gi : it->second) {
    Status s = prepared_.groups[gi].observer->observe(t);
    if (!s.ok() && status_.ok()) status_ = user_error("value '" + graph_.value(v).name + "'", s.error().what);
  }
}

Status Calibrator::observe_inputs(const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size() && i < graph_.inputs.size(); ++i) feed(graph_.inputs[i], inputs[i]);
  return status_;
}

void Calibrator::on_node_end(const NodeEvent& e) {
  for (size_t i = 0; i < e.node.outputs.size() && i < e.outputs.size(); ++i)
    if (e.node.outputs[i] != kNoValue && e.outputs[i] && e.outputs[i]->defined()) feed(e.node.outputs[i], *e.outputs[i]);
}

}  // namespace kiln::quant
