// drop_linear_reshapes: a linear layer written on 2-D rows between two Reshapes,
//   Reshape(x [d..., K] -> [M, K]) -> Gemm | MatMul (constant-shaped 2-D weight) -> Reshape(-> [d..., N])
// as GPT-2's Conv1D layers export (torch.addmm on a view), becomes a MatMul of x itself
// (MatMul takes N-D rows), plus an Add of the Gemm's bias: what BERT's layers look like. The
// patterns that follow a linear layer (its bias, a GELU, the residual Add, a quantized model's
// Q/DQ around it) then meet it directly: GPT-2's residual Adds fuse into the products before
// them, and in an int8 model its GELUs, residual Adds and LayerNorms stay int8.
//
// The input's Reshape may have a per-tensor QuantizeLinear -> DequantizeLinear after it (a
// quantized model's input Q/DQ), and so may the product before the second Reshape: they then
// quantize x and the N-D product, as elementwise ops give the same values in either shape.
// Every value of the chain must be read by the next node alone. The second Reshape must give
// x's leading dims back: its output's concrete shape says so, or, where they are symbolic (a
// model compiled without --input-shape), its shape operand, computed from x's own dims as
// GPT-2 writes it (`x.size()[:-1] + (N,)`: Concat(Slice(Shape(x)), N)) or from dims of the
// same symbols; the shape arithmetic then goes. Gemm must have transA = transB = 0 and alpha = beta = 1.
#include <algorithm>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/infer.h"

namespace kiln {

namespace {

std::optional<std::vector<int64_t>> concrete(const Graph& g, ValueId v) {
  if (v < 0 || !g.value(v).shape.is_concrete()) return std::nullopt;
  return g.value(v).shape.concrete();
}

// Dim 1 of a rank-2 value, where known.
std::optional<int64_t> columns(const Graph& g, ValueId v) {
  const Shape& s = g.value(v).shape;
  if (!s.rank_known || s.rank() != 2 || !s.dims[1].is_known()) return std::nullopt;
  return s.dims[1].value;
}

// Whether `reshape` gives x's leading dims back, then `n`: its output's concrete shape says so,
// or its shape operand's entries are x's dims in their places (same_dim: read from x, from what
// x dequantizes, or of the same symbol) or equal known ones, then n.
bool leading_dims_back(const Graph& g, const Matcher& mt, const Node& reshape, ValueId x, int64_t n) {
  const Shape& xs = g.value(x).shape;
  if (const auto out = concrete(g, reshape.outputs[0]); out && xs.is_concrete()) {
    std::vector<int64_t> want(xs.dims.size() - 1);
    for (size_t d = 0; d + 1 < xs.dims.size(); ++d) want[d] = xs.dims[d].value;
    want.push_back(n);
    return *out == want;
  }
  const std::optional<std::vector<DimTerm>> terms = dim_terms(mt, reshape.inputs[1]);
  if (!terms || terms->size() != xs.dims.size() || terms->back().of != kNoValue || terms->back().value != n) return false;
  for (size_t d = 0; d + 1 < terms->size(); ++d) {
    const DimTerm& t = (*terms)[d];
    const bool same = t.of == kNoValue ? t.value > 0 && xs.dims[d].is_known() && t.value == xs.dims[d].value : same_dim(mt, t.of, t.axis, x, d);
    if (!same) return false;
  }
  return true;
}

// One sweep over the graph: the layers it rewrote, and how many of them by their symbolic dims.
Result<size_t> drop_once(Graph& g, size_t& symbolic) {
  const std::vector<int32_t> producer = g.producers();
  const std::vector<size_t> readers = reader_counts(g);
  auto node_of = [&](ValueId v) -> const Node* {
    const int32_t p = v < 0 ? -1 : producer[static_cast<size_t>(v)];
    return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
  };
  const std::vector<std::vector<Use>> uses = g.uses();
  const Matcher mt(g);  // for the Reshapes' shape operands, which nothing here changes
  auto sole = [&](ValueId v) { return v >= 0 && readers[static_cast<size_t>(v)] == 1; };
  std::vector<char> drop(g.nodes.size(), 0);
  std::vector<std::vector<Node>> after(g.nodes.size());  // per node: what follows it
  std::vector<std::pair<ValueId, ValueId>> renamed;  // a dropped Reshape's output, and what its readers read instead
  size_t count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& m = g.nodes[i];
    if (!m.domain.empty() || (m.op != "Gemm" && m.op != "MatMul") || m.outputs.size() != 1 || !m.has_input(0) || !m.has_input(1)) continue;
    if (m.op == "Gemm" && (m.attr_int("transA", 0) != 0 || m.attr_int("transB", 0) != 0 || m.attr_float("alpha", 1.0) != 1.0 ||
                           m.attr_float("beta", 1.0) != 1.0))
      continue;
    const auto w = concrete(g, m.inputs[1]);
    const auto a_cols = columns(g, m.inputs[0]), y_cols = columns(g, m.outputs[0]);
    if (!w || w->size() != 2 || !a_cols || !y_cols || *a_cols <= 0) continue;
    const int64_t k = *a_cols, n = *y_cols;
    if (m.op == "Gemm" && m.has_input(2)) {  // a bias row that broadcasts over any leading dims alike
      const auto c = concrete(g, m.inputs[2]);
      if (!c || !((c->size() == 1 && (*c)[0] == n) || (c->size() == 2 && (*c)[0] == 1 && (*c)[1] == n))) continue;
    }
    // The input: Reshape(x) [-> Q -> DQ].
    const Node *dq = nullptr, *q = nullptr, *r1 = node_of(m.inputs[0]);
    if (r1 && per_tensor(g, *r1, "DequantizeLinear") && sole(m.inputs[0])) {
      dq = r1;
      q = node_of(dq->inputs[0]);
      if (!q || !per_tensor(g, *q, "QuantizeLinear") || !sole(dq->inputs[0])) continue;
      r1 = node_of(q->inputs[0]);
    }
    const ValueId r1_out = r1 ? r1->outputs[0] : kNoValue;
    if (!r1 || r1->op != "Reshape" || !r1->domain.empty() || !sole(r1_out) || g.value(r1_out).is_constant()) continue;
    const ValueId x = r1->inputs[0];
    // [d..., K] to [M, K]: M is the product of d, as the Reshape keeps the count.
    const Shape& xs = g.value(x).shape;
    if (!xs.rank_known || xs.rank() < 3 || xs.dims.back() != Dim::known(k)) continue;
    // The output: [Q -> DQ ->] a Reshape giving x's leading dims back, each read by the next alone.
    auto only_reader = [&](ValueId v) -> Node* {
      if (!sole(v) || uses[static_cast<size_t>(v)].size() != 1) return nullptr;
      const Use& u = uses[static_cast<size_t>(v)][0];
      return u.slot == Use::kCaptured || drop[u.node] ? nullptr : &g.nodes[u.node];
    };
    Node *q2 = nullptr, *dq2 = nullptr, *r2 = only_reader(m.outputs[0]);
    if (r2 && per_tensor(g, *r2, "QuantizeLinear") && r2->inputs[0] == m.outputs[0]) {
      q2 = r2;
      dq2 = only_reader(q2->outputs[0]);
      if (!dq2 || !per_tensor(g, *dq2, "DequantizeLinear") || dq2->inputs[0] != q2->outputs[0]) continue;
      r2 = only_reader(dq2->outputs[0]);
    }
    const ValueId into = dq2 ? dq2->outputs[0] : m.outputs[0];  // what the Reshape reads
    if (!r2 || r2->op != "Reshape" || !r2->domain.empty() || r2->inputs[0] != into || r2->outputs.size() != 1) continue;
    if (dq2 && std::find(g.outputs.begin(), g.outputs.end(), r2->outputs[0]) != g.outputs.end()) continue;
    if (!leading_dims_back(g, mt, *r2, x, n)) continue;
    symbolic += !g.value(r2->outputs[0]).shape.is_concrete();
    const size_t r2i = static_cast<size_t>(r2 - g.nodes.data());

    // x [-> Q -> DQ] -> MatMul [-> Add bias] [-> Q -> DQ], writing the second Reshape's output
    // (or, with Q -> DQ after it, its readers reading the DQ's).
    const Shape x_shape = g.value(x).shape;
    if (dq) {
      g.nodes[static_cast<size_t>(producer[static_cast<size_t>(dq->inputs[0])])].inputs[0] = x;
      g.value(q->outputs[0]).shape = x_shape;
      g.value(dq->outputs[0]).shape = x_shape;
    }
    const ValueId rows_in = dq ? dq->outputs[0] : x;
    drop[static_cast<size_t>(producer[static_cast<size_t>(r1_out)])] = 1;
    drop[r2i] = 1;
    ValueId out = r2->outputs[0];
    if (dq2) {
      const Shape shape = g.value(out).shape;
      for (ValueId v : {m.outputs[0], q2->outputs[0], dq2->outputs[0]}) g.value(v).shape = shape;
      renamed.emplace_back(out, dq2->outputs[0]);
      out = m.outputs[0];
    }
    std::vector<std::string> sources = m.sources.empty() ? std::vector<std::string>{m.name} : m.sources;
    for (const std::string& s : r2->sources.empty() ? std::vector<std::string>{r2->name} : r2->sources)
      if (std::find(sources.begin(), sources.end(), s) == sources.end()) sources.push_back(s);
    const ValueId bias = m.op == "Gemm" && m.has_input(2) ? m.inputs[2] : kNoValue;
    m.op = "MatMul";
    m.attrs.clear();
    m.kernel = {};
    m.inputs = {rows_in, m.inputs[1]};
    m.sources = sources;
    if (bias == kNoValue) {
      m.outputs = {out};
    } else {
      const ValueId product = g.add_value(g.unique_value_name(m.name + "_product"), g.value(out).dtype, g.value(out).shape);
      m.outputs = {product};
      Node add;
      add.name = m.name + "_bias";
      add.op = "Add";
      add.inputs = {product, bias};
      add.outputs = {out};
      add.sources = sources;
      after[i].push_back(std::move(add));
    }
    ++count;
  }
  if (count == 0) return count;
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!drop[i]) nodes.push_back(std::move(g.nodes[i]));
    for (Node& n : after[i]) nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  for (const auto& [from, to] : renamed) g.replace_all_uses(from, to);
  return count;
}

}  // namespace

Result<PassResult> drop_linear_reshapes(Model& model, PassContext&) {
  Graph& g = model.graph;
  size_t count = 0;
  // Where dims are symbolic, a layer's output has its dims only once its Reshape is gone and
  // shapes are inferred again (GPT-2's MLP: the second layer reads the first's GELU): sweep
  // until a sweep rewrites nothing by them.
  for (size_t symbolic = 1; symbolic > 0;) {
    symbolic = 0;
    KILN_ASSIGN_OR_RETURN(size_t swept, drop_once(g, symbolic));
    count += swept;
    if (symbolic > 0) {  // the second Reshapes' shape arithmetic goes, and the products get their dims
      erase_dead_shape_arithmetic(g);
      KILN_RETURN_IF_ERROR(infer_graph(g).status());
    }
  }
  if (count == 0) return PassResult{};
  drop_unused_values(g);
  return PassResult{true, "made " + count_of(count, "linear layer", "linear layers") + " on 2-D rows between Reshapes a MatMul of the rows' own shape"};
}

}  // namespace kiln
