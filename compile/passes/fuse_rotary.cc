// fuse_rotary: rotary position embedding as exporters write it (Hugging Face's
// apply_rotary_pos_emb with rotate_half) -> one RotaryEmbedding:
//
//   y = x · cos + Concat(Neg(Slice(x, D/2 .. D)), Slice(x, 0 .. D/2), axis -1) · sin
//
// (either operand order of each Mul and of the Add) on a 4-D f32 x [B, H, S, D] with D known,
// where cos and sin are f32 constants that broadcast onto x as [B or 1, 1, S, D] and whose
// second half of each row repeats the first (torch builds them as cat(freqs, freqs)): with
// concrete shapes, fold_constants has already turned the position tables' Slice/Gather into
// such constants. They become RotaryEmbedding's caches [B, S, D/2] (no position ids: a cache
// row per token). Every intermediate must be read by the pattern alone; x may have other
// readers. Anything else (interleaved pairs, a partial rotary dim, caches computed at run time)
// is left as it is.
#include <map>
#include <tuple>

#include "compile/passes/match.h"
#include "compile/passes/patterns.h"

namespace kiln {

namespace {

// Whether `s` is Slice(x, begin .. end) over the last axis of a 4-D x whose last dim is d, with
// step 1 (an end past d counts as d). Omitted axes mean axis 0 for one start, as in ONNX.
bool slices_last(const Graph& g, const Node* s, ValueId x, int64_t d, int64_t begin, int64_t end) {
  if (!s || s->inputs.empty() || s->inputs[0] != x) return false;
  const std::optional<SliceSpec> spec = constant_slice(g, *s);
  if (!spec || spec->starts.size() != 1) return false;
  return (spec->axes[0] == 3 || spec->axes[0] == -1) && spec->steps[0] == 1 && spec->starts[0] == begin && std::min(spec->ends[0], d) == end;
}

// The cache [B, S, D/2] of a constant `c` that broadcasts onto x [B, H, S, D] as [B or 1, 1, S,
// D] with each row's halves equal; nullopt otherwise.
std::optional<Tensor> cache_of(const Graph& g, ValueId c, const Shape& x) {
  const Value& v = g.value(c);
  if (!v.is_constant() || v.dtype != DType::f32 || v.constant.is_packed() || v.constant.rank() > 4) return std::nullopt;
  std::vector<int64_t> dims = v.constant.shape();
  dims.insert(dims.begin(), 4 - dims.size(), 1);
  const int64_t b = x.dims[0].value, s = x.dims[2].value, d = x.dims[3].value, half = d / 2;
  if ((dims[0] != 1 && dims[0] != b) || dims[1] != 1 || dims[2] != s || dims[3] != d) return std::nullopt;
  const float* p = v.constant.data<float>();
  Tensor cache(DType::f32, {b, s, half});
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < s; ++t) {
      const float* row = p + ((dims[0] == 1 ? 0 : i) * s + t) * d;
      for (int64_t e = 0; e < half; ++e) {
        if (row[e] != row[e + half]) return std::nullopt;
        cache.data<float>()[(i * s + t) * half + e] = row[e];
      }
    }
  return cache;
}

// The constant operand of a two-input Mul and the other one (kNoValue, kNoValue when neither or
// both are constant).
std::pair<ValueId, ValueId> constant_and_other(const Graph& g, const Node& mul) {
  const bool c0 = g.value(mul.inputs[0]).is_constant(), c1 = g.value(mul.inputs[1]).is_constant();
  if (c0 == c1) return {kNoValue, kNoValue};
  return c0 ? std::make_pair(mul.inputs[0], mul.inputs[1]) : std::make_pair(mul.inputs[1], mul.inputs[0]);
}

}  // namespace

Result<size_t> fuse_rotary(Graph& g) {
  Matcher m(g);
  Rewrite rw(g);
  size_t fused = 0;
  const size_t original_nodes = g.nodes.size(), values_before = g.values.size();
  std::map<std::tuple<ValueId, int64_t, int64_t, int64_t>, ValueId> caches;  // (table, B, S, D) -> its cache, or kNoValue
  for (size_t ai = 0; ai < original_nodes; ++ai) {
    const Node& add = g.nodes[ai];
    if (add.op != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    for (int order = 0; order < 2; ++order) {
      const Node* cos_mul = m.def(add.inputs[static_cast<size_t>(order)], "Mul");
      const Node* sin_mul = m.def(add.inputs[static_cast<size_t>(1 - order)], "Mul");
      if (!cos_mul || !sin_mul || cos_mul == sin_mul || cos_mul->inputs.size() != 2 || sin_mul->inputs.size() != 2) continue;
      const auto [cos, x] = constant_and_other(g, *cos_mul);
      const auto [sin, rotated] = constant_and_other(g, *sin_mul);
      if (cos == kNoValue || sin == kNoValue) continue;
      const Shape xs = g.value(x).shape;  // a copy: making the caches adds values
      if (g.value(x).dtype != DType::f32 || xs.rank() != 4 || !xs.is_concrete() || xs.dims[3].value % 2 != 0) continue;
      const int64_t d = xs.dims[3].value, half = d / 2;
      // rotate_half(x) = Concat(Neg(x[..., D/2:]), x[..., :D/2]).
      const Node* cat = m.def(rotated, "Concat");
      if (!cat || cat->inputs.size() != 2 || (cat->attr_int("axis", 0) != 3 && cat->attr_int("axis", 0) != -1)) continue;
      const Node* neg = m.def(cat->inputs[0], "Neg");
      const Node* upper = neg ? m.def(neg->inputs[0], "Slice") : nullptr;
      const Node* lower = m.def(cat->inputs[1], "Slice");
      if (!slices_last(g, upper, x, d, half, d) || !slices_last(g, lower, x, d, 0, half)) continue;
      if (!m.only_read_by(cos_mul->outputs[0], {&add}) || !m.only_read_by(sin_mul->outputs[0], {&add}) ||
          !m.only_read_by(rotated, {sin_mul}) || !m.only_read_by(cat->inputs[0], {cat}) || !m.only_read_by(neg->inputs[0], {neg}) ||
          !m.only_read_by(cat->inputs[1], {cat}))
        continue;
      const std::vector<size_t> idx = m.indices({upper, lower, neg, cat, sin_mul, cos_mul, &add});
      if (!rw.free(idx)) continue;
      // Q and K of every layer share their tables: one cache each.
      auto cache = [&](ValueId table) {
        const auto key = std::make_tuple(table, xs.dims[0].value, xs.dims[2].value, d);
        auto it = caches.find(key);
        if (it != caches.end()) return it->second;
        std::optional<Tensor> t = cache_of(g, table, xs);
        const ValueId made = t ? g.add_constant(g.value(table).name + "_cache", std::move(*t)) : kNoValue;
        return caches[key] = made;
      };
      const ValueId cos_cache = cache(cos), sin_cache = cache(sin);
      if (cos_cache == kNoValue || sin_cache == kNoValue) continue;
      Node rot;
      rot.name = add.name;
      rot.op = "RotaryEmbedding";
      rot.inputs = {x, cos_cache, sin_cache};
      rot.outputs = {add.outputs[0]};
      rw.replace(idx, std::move(rot));
      ++fused;
      break;
    }
  }
  if (fused == 0 && g.values.size() != values_before) g.remove_dead();  // caches of matches given up
  KILN_RETURN_IF_ERROR(rw.commit());
  return fused;
}

}  // namespace kiln
