// merge_transposes: a Transpose whose result is only reshaped by splitting dims and then
// transposed again is one Reshape (of the input, splitting the same dims) and one Transpose:
//
//   Transpose(X, p1) -> Reshape(., S) -> Transpose(., p2)   =>   Reshape(X, S') -> Transpose(., q)
//
// and two Transposes in a row are one (none at all when they cancel). Detection heads write
// this: the layout pass brings a channels-last convolution's output back to [N, C, H, W],
// which the model reshapes to [N, anchors, outputs, H, W] and transposes to [N, anchors, H, W,
// outputs]; merged, the elements move once, in rows of `outputs` contiguous floats, instead of
// twice. The Reshape may only split dims (each dim of the first Transpose's result becomes
// consecutive dims whose product it is), so it splits the input's dims just the same; the
// intermediates must be read by the chain alone, and every shape concrete.
#include <numeric>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"

namespace kiln {

namespace {

std::vector<int64_t> concrete(const Graph& g, ValueId v) {
  const Shape& s = g.value(v).shape;
  return s.is_concrete() ? s.concrete() : std::vector<int64_t>{};
}

// For each dim of `from`, the dims of `to` it splits into (consecutive, their product its
// size); nullopt when `to` is not `from` with dims split. Dims of size 1 match one dim of 1.
std::optional<std::vector<std::vector<int64_t>>> splits(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  std::vector<std::vector<int64_t>> groups;
  size_t j = 0;
  for (int64_t d : from) {
    std::vector<int64_t> group;
    int64_t p = 1;
    while (j < to.size() && (group.empty() || p < d)) {
      if (to[j] == 0 || p * to[j] > d) return std::nullopt;
      p *= to[j];
      group.push_back(to[j++]);
    }
    if (p != d || group.empty()) return std::nullopt;
    groups.push_back(std::move(group));
  }
  if (j != to.size()) return std::nullopt;
  return groups;
}

Node transpose_node(std::string name, ValueId in, ValueId out, const std::vector<int64_t>& perm) {
  Node t;
  t.name = std::move(name);
  t.op = "Transpose";
  t.inputs = {in};
  t.outputs = {out};
  t.set_attr("perm", perm);
  return t;
}

}  // namespace

Result<PassResult> merge_transposes(Model& model, PassContext&) {
  Graph& g = model.graph;
  Matcher m(g);
  Rewrite rw(g);
  size_t merged = 0, with_reshape = 0;
  const size_t original = g.nodes.size();
  for (size_t i = 0; i < original; ++i) {
    const Node& t2 = g.nodes[i];
    if (t2.op != "Transpose" || !t2.domain.empty() || t2.inputs.empty() || t2.outputs.size() != 1) continue;
    const std::vector<int64_t> z = concrete(g, t2.outputs[0]);
    if (z.empty()) continue;
    std::vector<int64_t> p2 = t2.attr_ints("perm");
    if (p2.empty()) p2.resize(z.size()), std::iota(p2.rbegin(), p2.rend(), 0);
    const Node* reshape = m.def(t2.inputs[0], "Reshape");
    const Node* t1 = nullptr;
    if (reshape && m.only_read_by(t2.inputs[0], {&t2})) t1 = m.def(reshape->inputs[0], "Transpose");
    else t1 = m.def(t2.inputs[0], "Transpose");
    const ValueId mid = reshape ? reshape->inputs[0] : t2.inputs[0];
    if (!t1 || !m.only_read_by(mid, {reshape ? reshape : &t2})) continue;
    const ValueId x = t1->inputs[0];
    const std::vector<int64_t> xs = concrete(g, x), ys = concrete(g, mid);
    const std::vector<int64_t> rs = reshape ? concrete(g, reshape->outputs[0]) : ys;
    if (xs.empty() || ys.empty() || rs.empty()) continue;
    std::vector<int64_t> p1 = t1->attr_ints("perm");
    if (p1.empty()) p1.resize(xs.size()), std::iota(p1.rbegin(), p1.rend(), 0);
    // Y = X[p1] is reshaped to R by splitting each Y dim i into groups[i]; the same split of
    // X's dim p1[i] gives X', and R is X' transposed by p1 over whole groups (q1).
    const std::optional<std::vector<std::vector<int64_t>>> groups = splits(ys, rs);
    if (!groups || p1.size() != xs.size()) continue;
    std::vector<int64_t> start(xs.size(), 0), x_split;  // where X dim d's group begins in X'
    std::vector<size_t> group_of(xs.size());
    for (size_t i1 = 0; i1 < p1.size(); ++i1) group_of[static_cast<size_t>(p1[i1])] = i1;
    for (size_t d = 0; d < xs.size(); ++d) {
      start[d] = static_cast<int64_t>(x_split.size());
      for (int64_t f : (*groups)[group_of[d]]) x_split.push_back(f);
    }
    std::vector<int64_t> q1;  // R dim j is X' dim q1[j]
    for (size_t i1 = 0; i1 < p1.size(); ++i1)
      for (size_t k = 0; k < (*groups)[i1].size(); ++k) q1.push_back(start[static_cast<size_t>(p1[i1])] + static_cast<int64_t>(k));
    std::vector<int64_t> q;  // Z dim k is X' dim q[k]
    for (int64_t k : p2) q.push_back(q1[static_cast<size_t>(k)]);
    std::vector<size_t> idx = m.indices(reshape ? std::vector<const Node*>{t1, reshape, &t2} : std::vector<const Node*>{t1, &t2});
    if (!rw.free(idx)) continue;
    // The new nodes: X reshaped to X' (when dims split), then transposed by q (unless q keeps
    // the order, when the Reshape to Z's shape is all there is).
    ValueId from = x;
    const bool identity = std::is_sorted(q.begin(), q.end());
    if (x_split != xs || identity) {
      const std::vector<int64_t>& shape = identity ? z : x_split;
      const ValueId split = identity ? t2.outputs[0] : g.add_value(g.value(x).name + "_split", g.value(x).dtype, Shape::of(shape));
      Node r;
      r.name = t2.name + (identity ? "" : "_split");
      r.op = "Reshape";
      r.inputs = {x, g.add_constant(r.name + "_shape", Tensor::from<int64_t>({static_cast<int64_t>(shape.size())}, shape))};
      r.outputs = {split};
      r.sources = merged_sources(g, idx);
      from = split;
      if (identity) {
        std::sort(idx.begin(), idx.end());
        rw.replace(idx, std::move(r));
        ++merged;
        with_reshape += reshape != nullptr;
        continue;
      }
      rw.add(std::move(r));
    }
    std::sort(idx.begin(), idx.end());
    rw.replace(idx, transpose_node(t2.name, from, t2.outputs[0], q));
    ++merged;
    with_reshape += reshape != nullptr;
  }
  if (merged == 0) return PassResult{};
  KILN_RETURN_IF_ERROR(rw.commit());
  drop_unused_values(g);
  return PassResult{true, "merged " + count_of(merged, "pair of Transposes", "pairs of Transposes") + " (" +
                              std::to_string(with_reshape) + " around a Reshape)"};
}

}  // namespace kiln
