// merge_transposes: a Transpose whose result is only reshaped by splitting or merging dims and
// then transposed again is one Reshape (of the input, its dims split or merged alike) and one
// Transpose:
//
//   Transpose(X, p1) -> Reshape(., S) -> Transpose(., p2)   =>   Reshape(X, S') -> Transpose(., q)
//
// and two Transposes in a row are one (none at all when they cancel). Detection heads write
// this: the layout pass brings a channels-last convolution's output back to [N, C, H, W],
// which the model reshapes to [N, anchors, outputs, H, W] and transposes to [N, anchors, H, W,
// outputs]; merged, the elements move once, in rows of `outputs` contiguous floats, instead of
// twice. So do vision transformers' patch embeddings, flatten(2).transpose(1, 2) of the
// convolution's [N, C, H, W] output: [N, C, H·W] to [N, H·W, C], which is the channels-last
// output as it lies (one Reshape, nothing moved). The Reshape may only split a dim of the
// first Transpose's result into consecutive dims whose product it is, or merge consecutive
// dims that lie side by side in the same order in the input, so that the input's dims split
// or merge just the same; the intermediates must be read by the chain alone, and every shape
// concrete.
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

// How a Reshape of Y to R regroups Y's dims: consecutive blocks, each one Y dim split into
// R dims (their product its size) or consecutive Y dims merged into one R dim. Dims of size 1
// match one dim of 1. nullopt when R is not Y so regrouped.
struct Block {
  size_t y0, y1, r0, r1;  ///< Y dims [y0, y1) are R dims [r0, r1); one of them a single dim
};
std::optional<std::vector<Block>> regroup(const std::vector<int64_t>& y, const std::vector<int64_t>& r) {
  std::vector<Block> blocks;
  size_t i = 0, j = 0;
  while (i < y.size() && j < r.size()) {
    Block b{i, i + 1, j, j + 1};
    if (y[i] == r[j]) {
      ++i, ++j;
    } else if (y[i] > r[j]) {  // Y dim i splits into R dims j...
      int64_t p = r[j++];
      while (p < y[i] && j < r.size() && r[j] != 0 && p * r[j] <= y[i]) p *= r[j++];
      if (p != y[i]) return std::nullopt;
      b.r1 = j, ++i;
    } else {  // ... or Y dims i... merge into R dim j
      int64_t p = y[i++];
      while (p < r[j] && i < y.size() && y[i] != 0 && p * y[i] <= r[j]) p *= y[i++];
      if (p != r[j]) return std::nullopt;
      b.y1 = i, ++j;
    }
    blocks.push_back(b);
  }
  if (i != y.size() || j != r.size()) return std::nullopt;
  return blocks;
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
    // Y = X[p1] is reshaped to R by regrouping Y's dims in blocks. The same regrouping of X's
    // dims gives X' (a split X dim split alike, merged Y dims merged where X has them side by
    // side in the same order), and R is X' transposed over whole blocks (q1).
    const std::optional<std::vector<Block>> blocks = regroup(ys, rs);
    if (!blocks || p1.size() != xs.size()) continue;
    std::vector<int> block_of(xs.size(), -1);  // the block of each X dim
    bool side_by_side = true;
    for (size_t b = 0; b < blocks->size(); ++b) {
      const Block& blk = (*blocks)[b];
      for (size_t i1 = blk.y0; i1 < blk.y1; ++i1) {
        block_of[static_cast<size_t>(p1[i1])] = static_cast<int>(b);
        if (i1 > blk.y0 && p1[i1] != p1[i1 - 1] + 1) side_by_side = false;
      }
    }
    if (!side_by_side) continue;
    std::vector<int64_t> start(blocks->size(), 0), x_split;  // where each block begins in X'
    for (size_t d = 0; d < xs.size(); ++d) {
      const Block& blk = (*blocks)[static_cast<size_t>(block_of[d])];
      if (static_cast<int64_t>(d) != p1[blk.y0]) continue;  // a merged block's later dims
      start[static_cast<size_t>(block_of[d])] = static_cast<int64_t>(x_split.size());
      for (size_t j = blk.r0; j < blk.r1; ++j) x_split.push_back(rs[j]);
    }
    std::vector<int64_t> q1;  // R dim j is X' dim q1[j]
    for (size_t b = 0; b < blocks->size(); ++b)
      for (size_t j = (*blocks)[b].r0; j < (*blocks)[b].r1; ++j)
        q1.push_back(start[b] + static_cast<int64_t>(j - (*blocks)[b].r0));
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
