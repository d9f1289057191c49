// merge_projections: matrix products that make several outputs from one input become one
// FusedMatMul whose columns are split into those outputs (`splits`):
//
//   MatMul | FusedMatMul (A, constant 2-D f32 B_i [, constant bias_i]) for i = 1..n, one A,
//   the same epilogue, or none and one other        -> FusedMatMul(A, [B_1 .. B_n], [bias_1 .. bias_n])
//                                                      (`activated`: the outputs the activation
//                                                      is for, when some have none)
//   Split(product [-> Reshape keeping the last dim], last axis)
//                                                   -> the product's columns split (the Reshape
//                                                      done on each part instead)
//
// The first is a transformer's Q, K and V projections of one normalized input (BERT's, the
// LLaMA block's with its narrower grouped-query K and V), and the LLaMA block's gate (with its
// SiLU) and up projections; the second is a projection exporters
// already packed and then cut into Q, K and V (GPT-2's c_attn, ViT's qkv). One product reads A
// once and spreads over the threads as one wider N, and no Split copies its output again: the
// GEMM writes each tile where its output lies. A product has no residual Z here and writes f32;
// its weight is f32, f16 or bf16 (what lower_precision made of it: kiln's f16 and bf16 GEMMs),
// the same for all it merges. Every split point is a multiple of 32 columns (f16: 64): some
// register tile of kiln's GEMM divides it on each ISA (AVX-512's 14x32, AVX2's 3x32, the f16
// GEMM's 6x64; the bf16 GEMM stores 16-column vectors), so no tile straddles two outputs; a
// product whose width is not stays apart.
//
// Then SwiGLU: a merged product of two equal f32 halves, one plain (up) and one activated (the
// gate's SiLU), whose outputs only one Mul reads, becomes a gated product (`gate_block` 64):
// its weight's columns reordered into blocks of 64 up columns then the 64 gate columns they
// pair with, so each register tile of the gates finds its values' tile just written, and the
// GEMM writes up · SiLU(gate) itself; the Mul goes. Each half's width must be a multiple of 64.
#include <algorithm>
#include <map>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/ops/epilogue.h"
#include "formats/text.h"

namespace kiln {

namespace {

constexpr int64_t kAlign = 32;

// A product of f32 A (rank 2 or more) by a constant 2-D f32, f16 or bf16 weight, with a constant
// bias or none and no residual, writing one f32 output: what may merge or take splits.
bool mergeable(const Graph& g, const Node& n) {
  if (!n.domain.empty() || !n.captures.empty() || n.outputs.size() != 1 || n.has_attr("splits")) return false;
  if (n.op == "MatMul") {
    if (n.num_inputs() != 2) return false;
  } else if (n.op != "FusedMatMul" || n.has_input(3)) {
    return false;
  }
  if (!n.has_input(0) || !n.has_input(1)) return false;
  const Value& a = g.value(n.inputs[0]);
  const Value& b = g.value(n.inputs[1]);
  const Value& y = g.value(n.outputs[0]);
  if (a.dtype != DType::f32 || a.shape.rank() < 2 || y.dtype != DType::f32 || !y.shape.rank_known) return false;
  if (!b.is_constant() || (b.dtype != DType::f32 && b.dtype != DType::f16 && b.dtype != DType::bf16) || b.constant.rank() != 2)
    return false;
  if (n.has_input(2)) {
    const Value& bias = g.value(n.inputs[2]);
    if (!bias.is_constant() || bias.dtype != DType::f32 || bias.constant.rank() != 1) return false;
  }
  return true;
}

// The epilogue's attributes as text: products merge only when theirs are the same.
std::string epilogue_key(const Node& n) {
  std::string key;
  for (const char* name : kActivationAttrs)
    if (const Attribute* a = n.find_attr(name)) key += std::string(name) + "=" + attribute_text(a->value) + ";";
  return key;
}

// Split points a product by `weight` may have: multiples of 32 columns for kiln's f32 GEMM,
// of 64 (its tile's width) for the f16 one.
int64_t alignment(DType weight) { return weight == DType::f16 ? 64 : kAlign; }

bool aligned(const std::vector<int64_t>& widths, DType weight) {
  int64_t at = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i)
    if ((at += widths[i]) % alignment(weight) != 0) return false;
  return true;
}

Tensor plain(const Tensor& t) { return t.is_packed() ? unpack(t) : t; }

// Node `n` as the product with split outputs: `outputs`, `widths` columns each.
void make_split(Node& n, std::vector<ValueId> outputs, const std::vector<int64_t>& widths) {
  n.op = "FusedMatMul";
  n.outputs = std::move(outputs);
  n.set_attr("splits", widths);
  n.kernel = {};
}

struct Merges {
  size_t products = 0, merged = 0, splits = 0, gated = 0;
};

// The gated products' block: a multiple of the tiles' widths it runs on (AVX-512's 6x64 and
// 14x32, AVX2's 6x16 and 3x32).
constexpr int64_t kGateBlock = 64;

// Split(P) or Split(Reshape(P)) along the last axis -> P with split outputs.
void fold_splits(Graph& g, std::vector<char>& drop, std::map<size_t, std::vector<Node>>& after, Merges& made) {
  const std::vector<int32_t> producer = g.producers();
  const std::vector<size_t> readers = reader_counts(g);
  auto only_reader = [&](ValueId v) { return readers[static_cast<size_t>(v)] == 1; };
  for (size_t si = 0; si < g.nodes.size(); ++si) {
    const Node& split = g.nodes[si];
    if (split.op != "Split" || !split.domain.empty() || !split.has_input(0) || split.outputs.size() < 2) continue;
    const ValueId x = split.inputs[0];
    const Shape& xs = g.value(x).shape;
    if (!xs.rank_known || xs.rank() < 2 || !xs.dims.back().is_known()) continue;  // leading dims may be symbolic
    const int64_t axis = split.attr_int("axis", 0);
    if (axis != -1 && axis != xs.rank() - 1) continue;
    const int64_t n = xs.dims.back().value;
    std::vector<int64_t> widths;
    if (split.has_input(1)) {
      const Value& s = g.value(split.inputs[1]);
      if (!s.is_constant() || s.constant.rank() != 1 || s.constant.numel() != static_cast<int64_t>(split.outputs.size())) continue;
      for (int64_t i = 0; i < s.constant.numel(); ++i) widths.push_back(static_cast<int64_t>(s.constant.as_double(i)));
    } else {
      const int64_t parts = static_cast<int64_t>(split.outputs.size());
      if (n % parts != 0) continue;
      widths.assign(static_cast<size_t>(parts), n / parts);
    }
    int64_t total = 0;
    bool ok = true;
    for (size_t i = 0; i < widths.size(); ++i) {
      ok = ok && widths[i] > 0 && split.outputs[i] != kNoValue;
      total += widths[i];
    }
    if (!ok || total != n || !only_reader(x)) continue;
    // The product, directly or through a Reshape that keeps the last dim.
    int32_t p = producer[static_cast<size_t>(x)];
    int32_t reshape = -1;
    if (p >= 0 && g.nodes[static_cast<size_t>(p)].op == "Reshape" && g.nodes[static_cast<size_t>(p)].domain.empty()) {
      const ValueId y = g.nodes[static_cast<size_t>(p)].inputs[0];
      const Shape& ys = g.value(y).shape;
      // The views to the Split's outputs need their shapes.
      const bool concrete = std::all_of(split.outputs.begin(), split.outputs.end(), [&](ValueId o) { return g.value(o).shape.is_concrete(); });
      if (!concrete || !ys.is_concrete() || ys.rank() < 2 || ys.dims.back().value != n || !only_reader(y)) continue;
      reshape = p;
      p = producer[static_cast<size_t>(y)];
    }
    if (p < 0 || drop[static_cast<size_t>(p)] || !mergeable(g, g.nodes[static_cast<size_t>(p)])) continue;
    if (!aligned(widths, g.value(g.nodes[static_cast<size_t>(p)].inputs[1]).dtype)) continue;
    Node& prod = g.nodes[static_cast<size_t>(p)];
    std::vector<ValueId> outputs = split.outputs;
    std::vector<std::string> sources = split.sources;
    if (reshape >= 0) {
      // Each part of the product's own shape, then a Reshape (a view) to the Split's output.
      const Node& r = g.nodes[static_cast<size_t>(reshape)];
      sources.insert(sources.begin(), r.sources.begin(), r.sources.end());
      const Shape ys = g.value(prod.outputs[0]).shape;  // a copy: add_value below may move the values
      for (size_t i = 0; i < outputs.size(); ++i) {
        Shape part = ys;
        part.dims.back() = Dim::known(widths[i]);
        const ValueId out = split.outputs[i];
        const ValueId rows = g.add_value(g.value(out).name + "_part", DType::f32, std::move(part));
        const std::vector<int64_t> to = g.value(out).shape.concrete();
        Tensor shape(DType::i64, {static_cast<int64_t>(to.size())});
        for (size_t d = 0; d < to.size(); ++d) shape.data<int64_t>()[d] = to[d];
        Node view;
        view.name = g.value(out).name + "_reshape";
        view.op = "Reshape";
        view.inputs = {rows, g.add_constant(g.unique_value_name(g.value(out).name + "_shape"), std::move(shape))};
        view.outputs = {out};
        view.sources = r.sources;
        after[si].push_back(std::move(view));
        outputs[i] = rows;
      }
      drop[static_cast<size_t>(reshape)] = 1;
    }
    prod.sources.insert(prod.sources.end(), sources.begin(), sources.end());
    make_split(prod, std::move(outputs), widths);
    drop[si] = 1;
    ++made.splits;
  }
}

// `members` (node indices in graph order, products of A) -> one product with split outputs,
// in the first one's place: its activations those of the members that have any, on the
// outputs of those (`activated`, when some have none).
void merge(Graph& g, ValueId a, const std::vector<size_t>& members, std::vector<char>& drop, Merges& made) {
  const int64_t k = g.value(g.nodes[members[0]].inputs[1]).constant.dim(0);
  std::vector<int64_t> widths, activated;
  bool bias = false;
  const Node* with_epilogue = nullptr;
  for (size_t i : members) {
    const Node& node = g.nodes[i];
    widths.push_back(g.value(node.inputs[1]).constant.dim(1));
    bias = bias || node.has_input(2);
    activated.push_back(epilogue_key(node).empty() ? 0 : 1);
    if (activated.back()) with_epilogue = &node;
  }
  int64_t n = 0;
  for (int64_t w : widths) n += w;
  const DType wt = g.value(g.nodes[members[0]].inputs[1]).dtype;
  const size_t bytes = dtype_size(wt);
  Tensor weight(wt, {k, n}), sum(DType::f32, {n});
  std::fill(sum.data<float>(), sum.data<float>() + n, 0.f);
  int64_t at = 0;
  std::vector<ValueId> outputs;
  std::vector<std::string> sources;
  for (size_t m = 0; m < members.size(); ++m) {
    const Node& node = g.nodes[members[m]];
    const Tensor b = plain(g.value(node.inputs[1]).constant);
    const auto* from = static_cast<const std::byte*>(b.raw());
    auto* to = static_cast<std::byte*>(weight.raw());
    for (int64_t r = 0; r < k; ++r)
      std::copy_n(from + static_cast<size_t>(r * widths[m]) * bytes, static_cast<size_t>(widths[m]) * bytes,
                  to + static_cast<size_t>(r * n + at) * bytes);
    if (node.has_input(2)) {
      const Tensor c = plain(g.value(node.inputs[2]).constant);
      std::copy_n(c.data<float>(), widths[m], sum.data<float>() + at);
    }
    at += widths[m];
    outputs.push_back(node.outputs[0]);
    sources.insert(sources.end(), node.sources.begin(), node.sources.end());
  }
  std::vector<Attribute> epilogue;
  if (with_epilogue)
    for (const char* name : kActivationAttrs)
      if (const Attribute* attr = with_epilogue->find_attr(name)) epilogue.push_back(*attr);
  const std::string base = g.value(g.nodes[members[0]].inputs[1]).name;
  std::vector<ValueId> inputs = {a, g.add_constant(g.unique_value_name(base + "_merged"), std::move(weight))};
  if (bias) inputs.push_back(g.add_constant(g.unique_value_name(base + "_merged_bias"), std::move(sum)));
  Node& merged = g.nodes[members[0]];
  merged.inputs = std::move(inputs);
  merged.sources = std::move(sources);
  for (const char* name : kActivationAttrs) merged.erase_attr(name);
  for (Attribute& attr : epilogue) merged.set_attr(attr.name, std::move(attr.value));
  if (std::find(activated.begin(), activated.end(), 0) != activated.end() && with_epilogue) merged.set_attr("activated", activated);
  make_split(merged, std::move(outputs), widths);
  for (size_t m = 1; m < members.size(); ++m) drop[members[m]] = 1;
  made.products += members.size();
  ++made.merged;
}

// Products of one input -> one product with split outputs: those with the same epilogue, and
// the plain ones (no activation) with those of the one other epilogue there is (the LLaMA
// block's gate, SiLU, and up projections, before their product).
void merge_siblings(Graph& g, std::vector<char>& drop, Merges& made) {
  std::map<std::pair<ValueId, DType>, std::map<std::string, std::vector<size_t>>> by_input;  // (A, weight type) -> epilogue -> members
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (drop[i] || !mergeable(g, n)) continue;
    const Value& w = g.value(n.inputs[1]);
    if (w.constant.dim(1) % alignment(w.dtype) != 0) continue;
    by_input[{n.inputs[0], w.dtype}][epilogue_key(n)].push_back(i);
  }
  for (const auto& [input, groups] : by_input) {
    const ValueId a = input.first;
    std::vector<std::vector<size_t>> merges;
    if (groups.size() == 2 && groups.count("")) {
      std::vector<size_t> all;
      for (const auto& [key, members] : groups) all.insert(all.end(), members.begin(), members.end());
      std::sort(all.begin(), all.end());
      merges.push_back(std::move(all));
    } else {
      for (const auto& [key, members] : groups) merges.push_back(members);
    }
    for (const std::vector<size_t>& members : merges)
      if (members.size() >= 2) merge(g, a, members, drop, made);
  }
}

// A merged product (up, act(gate)) whose two outputs one Mul alone reads -> the gated product
// writing that Mul's output.
void gate_products(Graph& g, std::vector<char>& drop, Merges& made) {
  std::vector<std::vector<size_t>> readers(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i])
      for (ValueId v : g.nodes[i].inputs)
        if (v != kNoValue) readers[static_cast<size_t>(v)].push_back(i);
  auto graph_output = [&](ValueId v) { return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end(); };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    const std::vector<int64_t> splits = n.attr_ints("splits"), on = n.attr_ints("activated");
    if (drop[i] || n.op != "FusedMatMul" || splits.size() != 2 || on.size() != 2 || on[0] == on[1] || splits[0] != splits[1] ||
        splits[0] % kGateBlock != 0 || n.has_attr("post_activation") || n.has_input(3) || g.value(n.inputs[1]).dtype != DType::f32)
      continue;
    const size_t gate = on[0] ? 0 : 1, up = 1 - gate;
    const ValueId yu = n.outputs[up], yg = n.outputs[gate];
    const std::vector<size_t>& ru = readers[static_cast<size_t>(yu)];
    if (ru.size() != 1 || readers[static_cast<size_t>(yg)] != ru || graph_output(yu) || graph_output(yg)) continue;
    const Node& mul = g.nodes[ru[0]];
    if (mul.op != "Mul" || !mul.domain.empty() || mul.inputs.size() != 2 || mul.inputs[0] == mul.inputs[1] ||
        g.value(mul.outputs[0]).shape != g.value(yu).shape || g.value(mul.outputs[0]).dtype != DType::f32)
      continue;
    // The weight's (and bias's) columns: each block of 64 up columns, then the 64 gate ones.
    const int64_t half = splits[0], k = g.value(n.inputs[1]).constant.dim(0);
    auto interleave = [&](const Tensor& t, int64_t rows) {
      Tensor out(DType::f32, t.shape());
      const float* from = t.data<float>();
      float* to = out.data<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < half; ++c) {
          const int64_t at = gated_value_column(c, kGateBlock);
          to[r * 2 * half + at] = from[r * 2 * half + static_cast<int64_t>(up) * half + c];
          to[r * 2 * half + at + kGateBlock] = from[r * 2 * half + static_cast<int64_t>(gate) * half + c];
        }
      return out;
    };
    const std::string base = g.value(n.inputs[1]).name;
    Tensor weight = interleave(plain(g.value(n.inputs[1]).constant), k);
    n.inputs[1] = g.add_constant(g.unique_value_name(base + "_gated"), std::move(weight));
    if (n.has_input(2)) {
      Tensor bias = interleave(plain(g.value(n.inputs[2]).constant), 1);
      n.inputs[2] = g.add_constant(g.unique_value_name(base + "_gated_bias"), std::move(bias));
    }
    n.erase_attr("splits");
    n.erase_attr("activated");
    n.set_attr("gate_block", kGateBlock);
    n.outputs = {mul.outputs[0]};
    n.sources.insert(n.sources.end(), mul.sources.begin(), mul.sources.end());
    drop[ru[0]] = 1;
    ++made.gated;
  }
}

}  // namespace

Result<PassResult> merge_projections(Model& model, PassContext&) {
  Graph& g = model.graph;
  std::vector<char> drop(g.nodes.size(), 0);
  std::map<size_t, std::vector<Node>> after;  // Reshapes to insert after a folded Split's place
  Merges made;
  fold_splits(g, drop, after, made);
  merge_siblings(g, drop, made);
  gate_products(g, drop, made);
  if (made.splits == 0 && made.merged == 0 && made.gated == 0) return PassResult{};
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!drop[i]) nodes.push_back(std::move(g.nodes[i]));
    if (auto it = after.find(i); it != after.end())
      for (Node& n : it->second) nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  drop_unused_values(g);
  std::string what;
  if (made.merged)
    what = "merged " + count_of(made.products, "product", "products") + " of a shared input into " +
           count_of(made.merged, "product", "products") + " with split outputs";
  if (made.splits)
    what += (what.empty() ? "folded " : "; folded ") + count_of(made.splits, "Split", "Splits") + " of a product's columns into it";
  if (made.gated)
    what += (what.empty() ? "gated " : "; gated ") + count_of(made.gated, "product", "products") + " (up · act(gate), the Mul in the GEMM)";
  return PassResult{true, what};
}

}  // namespace kiln
