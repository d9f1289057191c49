// fuse_attention: scaled dot-product attention as exporters write it -> one Attention node.
//
//   s = MatMul(Q, Kᵀ) [/ d | * c] [+ mask | Where(cond, ·, -big)]; Y = MatMul(Softmax(s), V)
//
// on 4-D [batch, heads, seq, head] tensors, every intermediate read by the pattern only. Kᵀ is
// usually a Transpose: of K itself (perm 0,1,3,2: K is read directly) or of the [batch, seq,
// heads, head] projection (perm 0,2,3,1: one Transpose to [batch, heads, seq, head] replaces
// it); any other Kᵀ gets a Transpose back. A Where(cond, s, c) with c ≤ -1e30 (a causal mask
// built with the float minimum) becomes the additive mask Where(cond, 0, c), which matches it
// wherever a row has a key left. K and V repeated for grouped-query heads
// (Reshape(Expand(Unsqueeze(t, [2])))) are read unrepeated: Attention maps query head h to
// key head h / (Hq / Hkv), as the repetition did. The scale becomes Attention's `scale`; a
// mask that is exactly causal (0 or true on and below the diagonal, ≤ -1e30 or false above
// it, the same for every batch and head), constant or computed from constants alone, becomes
// `is_causal`, which matches it exactly (every row keeps its first key): kernels then skip what
// it masks instead of reading an S×S tensor. When Q, K and V are each a projection split into
// heads (Reshape of a 3-D [B, S, H·D] to [B, S, H, D], then Transpose 0,2,1,3, or 0,2,3,1 for
// Kᵀ) and Y is merged back the same way (Transpose 0,2,1,3, Reshape to [B, S, H·D]), the
// Attention reads and writes the 3-D tensors (q_num_heads, kv_num_heads) and those transposes
// are gone: the kernels read each head where the projection wrote it. A packed projection
// [B, S, 3·H·D] reshaped to [B, S, 3, H, D], permuted (2,0,3,1,4), split on axis 0 and squeezed
// (ViT's qkv) is cut into Q, K and V by one Split along its features instead. When Q and K are
// RotaryEmbeddings (what fuse_rotary made of LLaMA's rotate_half) of the same caches [B, S,
// D/2], over the whole head, with as many keys as queries, the Attention reads Q and K before
// them and takes the caches as its rotary_cos / rotary_sin inputs: the kernel rotates each block
// as it loads it, and the heads' transposes can go as above.
#include <algorithm>
#include <array>
#include <map>

#include "compile/graph_util.h"
#include "compile/passes/match.h"
#include "compile/passes/patterns.h"

namespace kiln {

namespace {

bool rank4(const Graph& g, ValueId v) { return g.value(v).shape.rank() == 4; }

Shape permuted(const Shape& s, const std::vector<int64_t>& perm) {
  std::vector<Dim> d;
  for (int64_t p : perm) d.push_back(s.dims[static_cast<size_t>(p)]);
  return Shape(std::move(d));
}

// t when `v` is Reshape(Expand(Unsqueeze(t, [2]))) repeating t's heads for grouped-query
// attention, the three nodes read by nothing else; kNoValue otherwise.
ValueId unrepeated(const Matcher& m, ValueId v, std::vector<const Node*>& chain) {
  const Node* reshape = m.def(v, "Reshape");
  const Node* expand = reshape ? m.def(reshape->inputs[0], "Expand") : nullptr;
  const Node* unsq = expand ? m.def(expand->inputs[0], "Unsqueeze") : nullptr;
  if (!unsq || !m.only_read_by(reshape->inputs[0], {reshape}) || !m.only_read_by(expand->inputs[0], {expand})) return kNoValue;
  std::optional<std::vector<int64_t>> axes = m.reduce_axes(*unsq);
  const ValueId t = unsq->inputs[0];
  const Graph& g = m.graph();
  if (!axes || *axes != std::vector<int64_t>{2} || !rank4(g, t) || !rank4(g, v)) return kNoValue;
  const Shape& ts = g.value(t).shape;
  const Shape& vs = g.value(v).shape;
  // [B, Hkv, S, D] -> [B, Hkv·rep, S, D]: batch, sequence and head size unchanged.
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}})
    if (ts.dims[i] != vs.dims[i] || !(ts.dims[i].is_known() || ts.dims[i].is_symbolic())) return kNoValue;
  if (!ts.dims[1].is_known() || !vs.dims[1].is_known() || vs.dims[1].value % ts.dims[1].value != 0) return kNoValue;
  chain.insert(chain.end(), {reshape, expand, unsq});
  return t;
}

// Whether dim i of Reshape r's output is dim i of its input: the same number or symbol, or
// copied by a 0 in a constant shape (allowzero 0) whatever the dim (a batch or sequence that
// export left unknown).
bool keeps_dim(const Graph& g, const Node& r, size_t i) {
  const Shape& x = g.value(r.inputs[0]).shape;
  const Shape& y = g.value(r.outputs[0]).shape;
  if (i >= x.dims.size() || i >= y.dims.size()) return false;
  if (x.dims[i] == y.dims[i] && (x.dims[i].is_known() || x.dims[i].is_symbolic())) return true;
  if (r.attr_int("allowzero", 0) != 0 || r.inputs.size() < 2 || r.inputs[1] == kNoValue || !g.value(r.inputs[1]).is_constant())
    return false;
  const Tensor& shape = g.value(r.inputs[1]).constant;
  return !shape.is_packed() && shape.rank() == 1 && static_cast<int64_t>(i) < shape.numel() && shape.as_int64(static_cast<int64_t>(i)) == 0;
}

// The 3-D projection x when `split` is Reshape(x, [B, S, H, D]) of a [B, S, H·D] x, read only
// by `reader`; appends the Reshape to chain.
ValueId unsplit(const Matcher& m, ValueId split, const Node* reader, std::vector<const Node*>& chain) {
  const Node* r = m.def(split, "Reshape");
  if (!r || !m.only_read_by(split, {reader})) return kNoValue;
  const Graph& g = m.graph();
  const Shape& x = g.value(r->inputs[0]).shape;
  const Shape& y = g.value(split).shape;
  if (x.rank() != 3 || y.rank() != 4 || !keeps_dim(g, *r, 0) || !keeps_dim(g, *r, 1)) return kNoValue;
  if (!x.dims[2].is_known() || !y.dims[2].is_known() || !y.dims[3].is_known() || x.dims[2].value != y.dims[2].value * y.dims[3].value)
    return kNoValue;
  chain.push_back(r);
  return r->inputs[0];
}

// The 3-D projection x when `heads` is Transpose(Reshape(x, [B, S, H, D]), perm 0,2,1,3), the
// two read by nothing else but `reader`; appends both nodes to chain.
ValueId unsplit_heads(const Matcher& m, ValueId heads, const Node* reader, std::vector<const Node*>& chain) {
  const Node* t = m.def(heads, "Transpose");
  if (!t || !m.only_read_by(heads, {reader}) || t->attr_ints("perm") != std::vector<int64_t>{0, 2, 1, 3}) return kNoValue;
  std::vector<const Node*> mine = {t};
  const ValueId x = unsplit(m, t->inputs[0], t, mine);
  if (x != kNoValue) chain.insert(chain.end(), mine.begin(), mine.end());
  return x;
}

// The packed projection x [B, S, 3·H·D] when q, k and v are, in that order, the three parts of
// Squeeze(Split(Transpose(Reshape(x, [B, S, 3, H, D]), perm 2,0,3,1,4), axis 0), axis 0) (ViT's
// qkv), each read only by its reader and the rest by the pattern alone; appends the nodes.
ValueId packed_qkv(const Matcher& m, const std::array<ValueId, 3>& qkv, const std::array<const Node*, 3>& readers,
                   std::vector<const Node*>& chain) {
  std::vector<const Node*> mine;
  const Node* split = nullptr;
  for (size_t i = 0; i < 3; ++i) {
    const Node* sq = m.def(qkv[i], "Squeeze");
    if (!sq || !m.only_read_by(qkv[i], {readers[i]}) || m.reduce_axes(*sq) != std::vector<int64_t>{0}) return kNoValue;
    const Node* sp = m.def(sq->inputs[0], "Split");
    if (!sp || (split && sp != split) || sp->outputs.size() != 3 || sp->outputs[i] != sq->inputs[0] || !m.only_read_by(sq->inputs[0], {sq}))
      return kNoValue;
    split = sp;
    mine.push_back(sq);
  }
  if (split->attr_int("axis", 0) != 0) return kNoValue;
  const Node* t = m.def(split->inputs[0], "Transpose");
  if (!t || !m.only_read_by(split->inputs[0], {split}) || t->attr_ints("perm") != std::vector<int64_t>{2, 0, 3, 1, 4}) return kNoValue;
  const Node* r = m.def(t->inputs[0], "Reshape");
  if (!r || !m.only_read_by(t->inputs[0], {t})) return kNoValue;
  const Graph& g = m.graph();
  const Shape& x = g.value(r->inputs[0]).shape;
  const Shape& y = g.value(t->inputs[0]).shape;
  if (x.rank() != 3 || y.rank() != 5 || !y.is_concrete() || !x.is_concrete() || x.dims[0] != y.dims[0] || x.dims[1] != y.dims[1] ||
      y.dims[2].value != 3 || x.dims[2].value != 3 * y.dims[3].value * y.dims[4].value)
    return kNoValue;
  mine.insert(mine.end(), {split, t, r});
  chain.insert(chain.end(), mine.begin(), mine.end());
  return r->inputs[0];
}

// Whether `t` is a causal mask over scores [.., S, S]: the same for every batch and head
// (S·S elements), and for query i, key j, 0 (or true, for a Where's condition) where j <= i and
// <= -1e30 (false) where j > i.
bool is_causal_mask(const Tensor& t, const Shape& scores) {
  if (!t.defined() || t.is_packed() || t.rank() < 2 || scores.rank() != 4) return false;
  if (!scores.dims[2].is_known() || scores.dims[2] != scores.dims[3]) return false;
  const int64_t n = scores.dims[2].value;
  if (t.dim(t.rank() - 1) != n || t.dim(t.rank() - 2) != n || t.numel() != n * n) return false;
  if (t.dtype() != DType::f32 && t.dtype() != DType::boolean) return false;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at = i * n + j;
      const bool keep = t.dtype() == DType::boolean ? t.data<bool>()[at] : t.data<float>()[at] == 0.f;
      const bool drop = t.dtype() == DType::boolean ? !t.data<bool>()[at] : t.data<float>()[at] <= -1e30f;
      if (j <= i ? !keep : !drop) return false;
    }
  return true;
}

// Whether `rot` is a RotaryEmbedding Attention can take over for 4-D x [B, H, S, D]: rotate-half
// over the whole head, caches [B, S, D/2] without position ids.
bool foldable_rotary(const Graph& g, const Node& rot) {
  if (rot.inputs.size() != 3 || rot.attr_int("interleaved", 0) != 0) return false;
  const Shape& x = g.value(rot.inputs[0]).shape;
  if (x.rank() != 4 || !x.is_concrete() || x.dims[3].value % 2 != 0) return false;
  const int64_t dim = rot.attr_int("rotary_embedding_dim", 0);
  if (dim != 0 && dim != x.dims[3].value) return false;
  const std::vector<int64_t> cache = {x.dims[0].value, x.dims[2].value, x.dims[3].value / 2};
  for (size_t i : {1, 2})
    if (g.value(rot.inputs[i]).dtype != g.value(rot.inputs[0]).dtype || !g.value(rot.inputs[i]).shape.is_concrete() ||
        g.value(rot.inputs[i]).shape.concrete() != cache)
      return false;
  return true;
}

// Masks up to this many elements that depend on constants alone are computed at compile time
// to see whether they are causal (a 4096-token mask has 16M).
constexpr int64_t kMaxComputedMask = int64_t{1} << 26;

// Whether `t`, a dim of a value (a sequence length as exporters take it: Gather(Shape(x), 1)),
// is the length of the scores [.., S, S]: the same symbol, or the same number.
bool scores_length(const Graph& g, const DimTerm& t, const Shape& scores) {
  if (t.of == kNoValue || scores.rank() != 4) return false;
  const Dim& d = g.value(t.of).shape.dims[static_cast<size_t>(t.axis)];
  return (d.is_known() || d.is_symbolic()) && d == scores.dims[2] && d == scores.dims[3];
}

// Whether `mask` (an additive mask or a Where's condition) is causal over `scores` [.., S, S]
// for every S by the way it is built from the sequence length S, when S is not known (a
// model compiled without --input-shape; the scores' S a symbol), after Unsqueezes of leading
// axes and Casts:
//   GPT-2's condition: Cast(Trilu(ConstantOfShape([S, S], nonzero), upper 0, k 0), bool)
//   LLaMA's additive mask: Where(Less(Unsqueeze(R, 1), R), c <= -1e30, 0), R = Range(0, S, 1)
bool causal_by_construction(const Matcher& m, ValueId mask, const Shape& scores) {
  const Graph& g = m.graph();
  const bool condition = g.value(mask).dtype == DType::boolean;
  ValueId v = mask;
  for (const Node* n = m.def(v); n && (n->op == "Unsqueeze" || (condition && n->op == "Cast" && n->attr_string("to", "") == "bool"));
       n = m.def(v)) {
    if (n->op == "Unsqueeze") {  // axes before the last two
      const std::optional<std::vector<int64_t>> axes = m.reduce_axes(*n);
      const Shape& out = g.value(n->outputs[0]).shape;
      if (!axes || !out.rank_known) return false;
      for (int64_t a : *axes)
        if ((a < 0 ? a + out.rank() : a) >= out.rank() - 2) return false;
    }
    v = n->inputs[0];
  }
  const Node* n = m.def(v);
  if (!n) return false;
  if (condition && n->op == "Trilu") {
    if (n->attr_int("upper", 1) != 0 || (n->has_input(1) && int_constant(g, n->inputs[1]) != std::vector<int64_t>{0})) return false;
    const Node* ones = m.def(n->inputs[0], "ConstantOfShape");
    const Attribute* value = ones ? ones->find_attr("value") : nullptr;
    const Tensor* fill = value ? std::get_if<Tensor>(&value->value) : nullptr;
    if (!fill || fill->numel() != 1 || fill->as_double(0) == 0) return false;
    const std::optional<std::vector<DimTerm>> t = dim_terms(m, ones->inputs[0]);
    return t && t->size() == 2 && (*t)[0].of == (*t)[1].of && (*t)[0].axis == (*t)[1].axis && scores_length(g, (*t)[0], scores);
  }
  const std::optional<float> fill = n->inputs.size() == 3 ? m.scalar(n->inputs[1]) : std::nullopt;
  const std::optional<float> keep = n->inputs.size() == 3 ? m.scalar(n->inputs[2]) : std::nullopt;
  if (!condition && n->op == "Where" && fill && *fill <= -1e30f && keep == 0.f) {
    const Node* less = m.def(n->inputs[0], "Less");
    const Node* col = less ? m.def(less->inputs[0], "Unsqueeze") : nullptr;
    const Node* range = col ? m.def(col->inputs[0], "Range") : nullptr;
    if (!range || less->inputs[1] != col->inputs[0] || m.reduce_axes(*col) != std::vector<int64_t>{1}) return false;
    const std::optional<DimTerm> t = range_length(m, *range);
    return t && scores_length(g, *t, scores);
  }
  return false;
}

// Whether `mask` (an additive mask or a Where's condition) is causal over `scores`: a constant,
// computed from constants alone (exporters build it from the sequence length with
// Range/Less/Where or Trilu, which folding leaves to run time when it is large), or built from
// a symbolic sequence length as exporters build it (causal_by_construction).
bool causal(const Matcher& m, ValueId mask, ValueId scores) {
  const Graph& g = m.graph();
  const Value& mv = g.value(mask);
  if (mv.is_constant()) return is_causal_mask(mv.constant, g.value(scores).shape);
  if (causal_by_construction(m, mask, g.value(scores).shape)) return true;
  if (!mv.shape.is_concrete() || shape_numel(mv.shape.concrete()) > kMaxComputedMask) return false;
  std::optional<std::vector<size_t>> cone = constant_cone(g, mask);
  if (!cone) return false;
  Result<std::vector<Tensor>> t = evaluate_nodes(g, *cone, {mask});
  return t.ok() && is_causal_mask((*t)[0], g.value(scores).shape);
}

}  // namespace

Result<size_t> fuse_attention(Graph& g) {
  Matcher m(g);
  Rewrite rw(g);
  size_t fused = 0;
  const size_t original_nodes = g.nodes.size(), values_before = g.values.size();
  std::map<ValueId, bool> causal_masks;
  for (size_t si = 0; si < original_nodes; ++si) {
    const Node& sm = g.nodes[si];
    if (sm.op != "Softmax" || !sm.domain.empty() || !rank4(g, sm.inputs[0]) || g.value(sm.inputs[0]).dtype != DType::f32) continue;
    const int64_t axis = sm.attr_int("axis", -1);
    if (axis != -1 && axis != 3) continue;
    const Node* pv = m.single_reader(sm.outputs[0]);
    if (!pv || pv->op != "MatMul" || pv->inputs[0] != sm.outputs[0] || !rank4(g, pv->inputs[1])) continue;
    std::vector<const Node*> chain = {&sm, pv};
    ValueId s = sm.inputs[0];
    // The scores before the mask: MatMul(Q, Kᵀ), maybe scaled by a scalar constant.
    auto scaled_scores = [&](ValueId cand) {
      const Node* below = m.def(cand);
      if (below && (below->op == "Div" || below->op == "Mul") && below->inputs.size() == 2)
        for (ValueId c : below->inputs)
          if (m.scalar(c) && !(below->op == "Div" && c == below->inputs[0])) below = m.def(Matcher::other(*below, c));
      return below && below->op == "MatMul";
    };
    // The mask.
    ValueId mask = kNoValue, where_cond = kNoValue, where_fill = kNoValue;
    const Node* n = m.def(s);
    if (n && m.only_read_by(s, {&sm})) {
      if (n->op == "Add" && n->inputs.size() == 2) {
        for (ValueId cand : n->inputs)
          if (scaled_scores(cand) && m.only_read_by(cand, {n})) {
            mask = Matcher::other(*n, cand);
            s = cand;
            chain.push_back(n);
            break;
          }
      } else if (n->op == "Where" && n->inputs.size() == 3) {
        std::optional<float> fill = m.scalar(n->inputs[2]);
        if (fill && *fill <= -1e30f && scaled_scores(n->inputs[1]) && m.only_read_by(n->inputs[1], {n})) {
          where_cond = n->inputs[0];
          where_fill = n->inputs[2];
          s = n->inputs[1];
          chain.push_back(n);
        }
      }
    }
    // The scale: scores / d or scores * c.
    double scale = 1.0;
    const Node* reader = chain.size() > 2 ? chain.back() : &sm;  // the node reading `s` so far
    n = m.def(s);
    if (n && (n->op == "Div" || n->op == "Mul") && n->inputs.size() == 2 && m.only_read_by(s, {reader})) {
      ValueId c = n->inputs[1], rest = n->inputs[0];
      if (n->op == "Mul" && !m.scalar(c)) std::swap(c, rest);
      std::optional<float> k = m.scalar(c);
      if (k && *k != 0) {
        scale = n->op == "Div" ? 1.0 / *k : *k;
        s = rest;
        chain.push_back(n);
        reader = n;
      }
    }
    const Node* qk = m.def(s, "MatMul");
    if (!qk || !m.only_read_by(s, {reader})) continue;
    chain.push_back(qk);
    ValueId q = qk->inputs[0];
    const ValueId kt = qk->inputs[1];
    ValueId v = pv->inputs[1];
    if (!rank4(g, q) || !rank4(g, kt)) continue;
    // K from Kᵀ.
    ValueId k = kNoValue;
    std::vector<Node> made;
    const Node* tr = m.def(kt, "Transpose");
    const std::vector<int64_t> perm = tr ? tr->attr_ints("perm") : std::vector<int64_t>{};
    if (tr && m.only_read_by(kt, {qk}) && perm == std::vector<int64_t>{0, 1, 3, 2}) {
      k = tr->inputs[0];
      chain.push_back(tr);
    } else {
      ValueId from = kt;
      std::vector<int64_t> back = {0, 1, 3, 2};
      if (tr && m.only_read_by(kt, {qk}) && perm == std::vector<int64_t>{0, 2, 3, 1}) {
        from = tr->inputs[0];
        back = {0, 2, 1, 3};
        chain.push_back(tr);
      }
      k = g.add_value(g.value(kt).name + "_k", DType::f32, permuted(g.value(from).shape, back));
      Node t;
      t.name = g.value(kt).name + "_k";
      t.op = "Transpose";
      t.inputs = {from};
      t.outputs = {k};
      t.set_attr("perm", back);
      made.push_back(std::move(t));
    }
    // The nodes reading Q, K and V (K's only when it is read directly) as the pattern goes down.
    const Node *q_reader = qk, *k_reader = made.empty() ? tr : nullptr, *v_reader = pv;
    // Grouped-query heads: read K and V before their repetition (both or neither).
    if (made.empty()) {
      std::vector<const Node*> repeat;
      ValueId k0 = unrepeated(m, k, repeat), v0 = unrepeated(m, v, repeat);
      if (k0 != kNoValue && v0 != kNoValue && g.value(k0).shape.dims[1] == g.value(v0).shape.dims[1]) {
        k = k0;
        v = v0;
        k_reader = repeat[2], v_reader = repeat[5];  // the Unsqueezes
        chain.insert(chain.end(), repeat.begin(), repeat.end());
      }
    }
    // RoPE: Q and K rotated by the same caches, read before their rotation.
    ValueId rotary_cos = kNoValue, rotary_sin = kNoValue;
    if (made.empty()) {
      const Node* rq = m.def(q, "RotaryEmbedding");
      const Node* rk = m.def(k, "RotaryEmbedding");
      if (rq && rk && rq != rk && foldable_rotary(g, *rq) && foldable_rotary(g, *rk) && rq->inputs[1] == rk->inputs[1] &&
          rq->inputs[2] == rk->inputs[2] && g.value(q).shape.dims[2] == g.value(k).shape.dims[2] && m.only_read_by(q, {qk}) &&
          m.only_read_by(k, {k_reader})) {
        chain.insert(chain.end(), {rq, rk});
        q = rq->inputs[0], k = rk->inputs[0];
        q_reader = rq, k_reader = rk;
        rotary_cos = rq->inputs[1], rotary_sin = rq->inputs[2];
      }
    }
    // A causal mask becomes is_causal.
    const ValueId mask_or_cond = mask != kNoValue ? mask : where_cond;
    if (mask_or_cond != kNoValue && !causal_masks.count(mask_or_cond))
      causal_masks[mask_or_cond] = causal(m, mask_or_cond, s);  // layers share their mask
    const bool is_causal = mask_or_cond != kNoValue && causal_masks[mask_or_cond];
    if (is_causal) mask = where_cond = kNoValue;
    if (where_cond != kNoValue) {
      mask = g.add_value(g.value(where_cond).name + "_additive", DType::f32, g.value(where_cond).shape);
      Node w;
      w.name = g.value(where_cond).name + "_additive";
      w.op = "Where";
      w.inputs = {where_cond, g.add_constant(w.name + "_zero", Tensor::from<float>({}, {0.f})), where_fill};
      w.outputs = {mask};
      made.push_back(std::move(w));
    }
    // Sequence-major: Q, K and V split from 3-D projections and Y merged back into one.
    ValueId y = pv->outputs[0];
    int64_t q_heads = 0, kv_heads = 0;  // set when the Attention is sequence-major
    std::vector<const Node*> seq_chain;
    ValueId q3 = unsplit_heads(m, q, q_reader, seq_chain), v3 = unsplit_heads(m, v, v_reader, seq_chain);
    ValueId k3 = kNoValue;
    const bool k_made = !made.empty() && made[0].outputs[0] == k;  // the Transpose from Kᵀ back to K
    if (k_made && tr && made[0].inputs[0] == tr->inputs[0] && made[0].attr_ints("perm") == std::vector<int64_t>{0, 2, 1, 3})
      k3 = unsplit(m, made[0].inputs[0], tr, seq_chain);  // Kᵀ was Transpose 0,2,3,1 of the split projection
    else if (!k_made)
      k3 = unsplit_heads(m, k, k_reader, seq_chain);
    ValueId packed = kNoValue;  // one [B, S, 3·H·D] projection that Q, K and V are cut from
    if (q3 == kNoValue && k3 == kNoValue && v3 == kNoValue && !k_made) {
      seq_chain.clear();
      packed = packed_qkv(m, {q, k, v}, {q_reader, k_reader, v_reader}, seq_chain);
    }
    const Node* yt = m.single_reader(y);
    const Node* yr = yt && yt->op == "Transpose" && yt->attr_ints("perm") == std::vector<int64_t>{0, 2, 1, 3} ? m.single_reader(yt->outputs[0]) : nullptr;
    if ((packed != kNoValue || (q3 != kNoValue && k3 != kNoValue && v3 != kNoValue)) && yr && yr->op == "Reshape" &&
        yr->inputs[0] == yt->outputs[0]) {
      const Shape& y4 = g.value(y).shape;
      const Shape& ym = g.value(yr->outputs[0]).shape;
      // [B, H, S, D] -> [B, S, H, D] -> [B, S, H·D]: the merge keeps B and S.
      if (ym.rank() == 3 && y4.rank() == 4 && y4.dims[1].is_known() && y4.dims[3].is_known() && keeps_dim(g, *yr, 0) &&
          keeps_dim(g, *yr, 1) && ym.dims[2].is_known() && ym.dims[2].value == y4.dims[1].value * y4.dims[3].value) {
        const Dim hq = g.value(q).shape.dims[1], hkv = g.value(k).shape.dims[1];
        if (hq.is_known() && hkv.is_known()) {
          chain.insert(chain.end(), seq_chain.begin(), seq_chain.end());
          chain.insert(chain.end(), {yt, yr});
          if (k_made) made.erase(made.begin());
          if (packed != kNoValue) {  // one Split along the features cuts the projection into Q, K and V
            const Shape ps = g.value(packed).shape;  // a copy: adding values below moves them
            const int64_t part = ps.dims[2].value / 3;
            Node cut;
            cut.name = g.value(packed).name + "_qkv";
            cut.op = "Split";
            cut.inputs = {packed, g.add_constant(cut.name + "_sizes", Tensor::from<int64_t>({3}, {part, part, part}))};
            cut.set_attr("axis", int64_t{2});
            for (const char* part_name : {"_q", "_k", "_v"})
              cut.outputs.push_back(g.add_value(g.value(packed).name + part_name, DType::f32, Shape({ps.dims[0], ps.dims[1], Dim::known(part)})));
            q3 = cut.outputs[0], k3 = cut.outputs[1], v3 = cut.outputs[2];
            made.push_back(std::move(cut));
          }
          q = q3, k = k3, v = v3, y = yr->outputs[0];
          q_heads = hq.value, kv_heads = hkv.value;
        }
      }
    }
    std::vector<size_t> idx = m.indices(chain);
    if (!rw.free(idx)) continue;
    Node att;
    att.name = pv->name;
    att.op = "Attention";
    att.inputs = {q, k, v};
    if (mask != kNoValue) att.inputs.push_back(mask);
    if (rotary_cos != kNoValue) {
      att.inputs.resize(7, kNoValue);
      att.inputs.insert(att.inputs.end(), {rotary_cos, rotary_sin});
    }
    att.outputs = {y};
    if (q_heads > 0) {
      att.set_attr("q_num_heads", q_heads);
      att.set_attr("kv_num_heads", kv_heads);
    }
    att.set_attr("scale", scale);
    if (is_causal) att.set_attr("is_causal", int64_t{1});
    std::sort(idx.begin(), idx.end());  // sources in graph order
    for (Node& t : made) rw.add(std::move(t));
    rw.replace(idx, std::move(att));
    ++fused;
  }
  if (fused == 0 && g.values.size() != values_before) g.remove_dead();  // values of matches given up
  KILN_RETURN_IF_ERROR(rw.commit());
  return fused;
}

}  // namespace kiln
