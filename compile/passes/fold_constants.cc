// fold_constants: nodes whose inputs are all constants are run once, now, on the reference
// kernels, and their outputs become constants; so do outputs whose data shape inference already
// computed (Shape -> Gather -> Concat chains on concrete shapes), even when their inputs are not
// constants. A Reshape whose shape is computed from shapes that are not known yet (a symbolic
// batch or sequence: Concat(Shape(x)[0], Shape(x)[1], 12, 64)) gets a constant shape when each
// entry is a number or x's own dim in its place (0: copy it; the shape of what x dequantizes,
// as a quantized model reads it before its Q/DQ pair, counts as x's), one other entry at most
// (-1): inference then knows the output's dims, the patterns can see a head split, and the
// shape arithmetic, run on every call before, goes.
//
// What is never folded:
// - ops outside the core set (no reference kernel, and nothing says they are pure);
// - nodes holding subgraphs (If/Loop/Scan): running one is not a fold of its inputs alone;
// - results past the size cap below;
// - the DequantizeLinear of a constant weight that a convolution or matrix product reads (a
//   quantized model's):
//   lower_int8 gives it to an int8 kernel as it is, or folds it when none takes it.
// kiln's core op set has no random or stateful ops (export refuses RandomNormal, Bernoulli, …),
// so every core op is a pure function of its inputs; an op added later that is not must get an
// OpTraits flag that this pass and cse check.
#include <algorithm>
#include <set>
#include <string_view>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/infer.h"
#include "runtime/session.h"

namespace kiln {

namespace {

// The size cap. A folded value is stored in the model file, so folding must not blow the file
// up: no output over 1 MiB that is larger than the node's inputs together (Expand, Tile,
// ConstantOfShape turning a few bytes into a big tensor, which is better computed at run time
// than stored). An output no larger than its inputs folds whatever its size: a transposed or
// sliced weight (GPT-2's tied LM head, 154 MB) computed on every run costs far more than the
// bytes it adds to the file.
constexpr size_t kMaxGrowthBytes = size_t{1} << 20;

bool too_big(size_t out_bytes, size_t in_bytes) { return out_bytes > kMaxGrowthBytes && out_bytes > in_bytes; }

bool has_subgraph(const Node& n) {
  return std::any_of(n.attrs.begin(), n.attrs.end(),
                     [](const Attribute& a) { return std::holds_alternative<std::shared_ptr<Graph>>(a.value); });
}

// Bytes of the node's outputs from their inferred shapes, or nullopt when one is not concrete.
std::optional<size_t> output_bytes(const Graph& g, const Node& n) {
  size_t total = 0;
  for (ValueId o : n.outputs) {
    if (o < 0) continue;
    const Value& v = g.value(o);
    if (!v.shape.is_concrete()) return std::nullopt;
    const int64_t numel = shape_numel(v.shape.concrete());
    if (numel < 0) return std::nullopt;
    total += *storage_bytes(v.dtype, numel);
  }
  return total;
}

// A DequantizeLinear whose output a convolution or a matrix product reads as its weight.
bool dequantized_weight(const Graph& g, const std::vector<std::vector<Use>>& uses, const Node& n) {
  if (n.op != "DequantizeLinear" || !n.domain.empty() || n.outputs.size() != 1 || n.outputs[0] < 0) return false;
  for (const Use& u : uses[static_cast<size_t>(n.outputs[0])]) {
    const std::string& op = g.nodes[u.node].op;
    if (u.slot == 1 && (op == "Conv" || op == "FusedConv" || op == "MatMul" || op == "Gemm" || op == "FusedMatMul")) return true;
  }
  return false;
}

// Gives every Reshape whose shape is computed from shapes a constant one where the entries allow
// (the file's header), and every Expand of x whose shape, of x's rank, is computed from shapes
// one where each entry is a number or x's own dim in its place (a 1 there: broadcasting keeps
// it; LLaMA's grouped-query heads, repeated to [B, Hkv, n, S, D] by Shape(k)'s dims); returns
// how many of each.
std::pair<size_t, size_t> constant_computed_shapes(Graph& g) {
  std::vector<std::pair<size_t, Tensor>> fixes;
  size_t expands = 0;
  {
    Matcher m(g);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      const bool reshape = n.op == "Reshape";
      if ((!reshape && n.op != "Expand") || !n.domain.empty() || n.inputs.size() != 2 || n.inputs[1] == kNoValue ||
          g.value(n.inputs[1]).is_constant() || n.attr_int("allowzero", 0) != 0)
        continue;
      std::optional<std::vector<DimTerm>> terms = dim_terms(m, n.inputs[1]);
      if (!terms || g.value(n.inputs[1]).shape.rank() != 1) continue;
      const Shape& xs = g.value(n.inputs[0]).shape;
      if (!reshape && (!xs.rank_known || xs.rank() != static_cast<int64_t>(terms->size()))) continue;
      std::vector<int64_t> shape;
      int inferred = 0;  // a Reshape's entries left to -1: the one whose product the others leave
      bool zero = false;
      for (size_t d = 0; d < terms->size(); ++d) {
        const DimTerm& t = (*terms)[d];
        if (t.of == kNoValue) {
          shape.push_back(t.value);
          inferred += t.value == -1;
          zero = zero || t.value == 0;
        } else if (same_dim(m, t.of, t.axis, n.inputs[0], d)) {
          shape.push_back(reshape ? 0 : 1);
        } else {
          shape.push_back(-1);
          ++inferred;
        }
      }
      // -1 cannot stand for a dim beside a 0-sized one (it would be 0 / 0); an Expand has none.
      if ((reshape && (inferred > 1 || (inferred == 1 && zero))) || (!reshape && std::count(shape.begin(), shape.end(), -1) > 0)) continue;
      fixes.emplace_back(i, Tensor::from<int64_t>({static_cast<int64_t>(shape.size())}, shape));
      expands += !reshape;
    }
  }
  for (auto& [i, shape] : fixes) {
    const std::string name = g.value(g.nodes[i].inputs[1]).name + "_static";
    const ValueId c = g.add_constant(name, std::move(shape));
    g.nodes[i].inputs[1] = c;
  }
  // The shape arithmetic nothing reads now goes at once: a pattern asking whether a projection
  // is read by its head split alone must not count a dead Shape of it.
  if (!fixes.empty()) erase_dead_shape_arithmetic(g);
  return {fixes.size() - expands, expands};
}

// A Range(0, n, 1) whose limit n is a symbolic dim of a value (a sequence length as exporters
// take it: Gather(Shape(input_ids), 1)) has n elements: its output's dim gets that symbol,
// which inference cannot compute (the limit is data), so that the positions, the embeddings
// gathered by them and what those are added to keep the sequence's symbol. Returns how many.
size_t symbolic_range_lengths(Graph& g) {
  const Matcher m(g);
  size_t named = 0;
  for (const Node& n : g.nodes) {
    const std::optional<DimTerm> t = range_length(m, n);
    if (!t || n.outputs.size() != 1 || n.outputs[0] == kNoValue) continue;
    const Dim d = g.value(t->of).shape.dims[static_cast<size_t>(t->axis)];
    Value& out = g.value(n.outputs[0]);
    if (!d.is_symbolic() || (out.shape.rank_known && out.shape.rank() == 1 && out.shape.dims[0] == d)) continue;
    out.shape = Shape({d});
    ++named;
  }
  return named;
}

}  // namespace

Result<PassResult> fold_constants(Model& model, PassContext&) {
  Graph& g = model.graph;
  // Shape arithmetic: inference records the data it can compute. It runs on a copy (tensors
  // are shared, not copied), so that a pass that folds nothing leaves the model as it was;
  // the copy's shapes, at least as precise as the stored ones, size the results.
  Graph probe = g;
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> known, infer_graph(probe));
  std::vector<char> folded(g.nodes.size(), 0);
  const std::vector<std::vector<Use>> uses = g.uses();
  size_t by_kernel = 0, by_inference = 0, capped = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const bool any_output = std::any_of(n.outputs.begin(), n.outputs.end(), [](ValueId o) { return o >= 0; });
    if (!n.domain.empty() || has_subgraph(n) || !any_output || dequantized_weight(g, uses, n)) continue;
    bool inferred = true, constant_inputs = true;
    size_t in_bytes = 0;
    for (ValueId o : n.outputs)
      if (o >= 0) inferred = inferred && static_cast<size_t>(o) < known.size() && known[static_cast<size_t>(o)].defined();
    for (ValueId in : n.inputs) {
      if (in < 0) continue;
      constant_inputs = constant_inputs && g.value(in).is_constant();
      if (g.value(in).is_constant()) in_bytes += g.value(in).constant.nbytes();
    }
    if (!inferred && !constant_inputs) continue;
    std::optional<size_t> out_bytes = output_bytes(probe, n);
    if (out_bytes && too_big(*out_bytes, in_bytes)) {
      ++capped;
      continue;
    }
    std::vector<Tensor> results;
    if (inferred) {
      for (ValueId o : n.outputs) results.push_back(o >= 0 ? known[static_cast<size_t>(o)] : Tensor());
    } else {
      std::vector<ValueId> outs;
      for (ValueId o : n.outputs)
        if (o >= 0) outs.push_back(o);
      Result<std::vector<Tensor>> r = evaluate_nodes(g, {i}, outs);
      // A node whose kernel refuses its constants (data a kernel checks beyond what inference
      // checked) is left for run time to report in its own words.
      if (!r.ok() && r.error().kind == ErrorKind::user) continue;
      if (!r.ok()) return r.error();
      size_t k = 0, total = 0;
      for (ValueId o : n.outputs) {
        if (o < 0) {
          results.emplace_back();
          continue;
        }
        total += (*r)[k].nbytes();
        results.push_back((*r)[k++]);
      }
      if (too_big(total, in_bytes)) {  // shapes the stored ones did not tell
        ++capped;
        continue;
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] < 0) continue;
      Value& v = g.value(n.outputs[k]);
      if (results[k].dtype() != v.dtype)
        return internal_error(n.where(), "folding gave " + std::string(dtype_name(results[k].dtype())) + " for '" + v.name +
                                             "', declared " + std::string(dtype_name(v.dtype)));
      v.shape = Shape::of(results[k].shape());
      v.constant = results[k];
    }
    folded[i] = 1;
    (inferred ? by_inference : by_kernel) += 1;
  }
  const size_t count = by_kernel + by_inference;
  if (count > 0) erase_nodes(g, folded);
  const size_t ranges = symbolic_range_lengths(g);
  if (ranges > 0) KILN_RETURN_IF_ERROR(infer_graph(g).status());  // the symbol, wherever the positions go
  // Each constant shape gives inference dims that a later shape's entries may be (LLaMA's
  // grouped-query Expand reads K's dims, known once its head split's Reshape is): again until
  // none is left to give.
  size_t reshapes = 0, expands = 0;
  for (auto made = constant_computed_shapes(g); made.first + made.second > 0; made = constant_computed_shapes(g)) {
    reshapes += made.first;
    expands += made.second;
    KILN_RETURN_IF_ERROR(infer_graph(g).status());  // the reshaped values' dims
  }
  if (count == 0 && reshapes == 0 && expands == 0 && ranges == 0)
    return PassResult{false, capped ? "no change (" + count_of(capped, "node", "nodes") + " over the size cap)" : ""};
  const size_t dropped = drop_unused_values(g);
  std::string summary = "folded " + count_of(count, "node", "nodes") + " (" + std::to_string(by_inference) +
                        " from shape inference)";
  if (ranges > 0) summary += ", gave " + count_of(ranges, "Range its symbolic length", "Ranges their symbolic lengths");
  if (reshapes > 0) summary += ", gave " + count_of(reshapes, "Reshape a constant shape", "Reshapes constant shapes");
  if (expands > 0) summary += ", gave " + count_of(expands, "Expand a constant shape", "Expands constant shapes");
  summary += ", dropped " + count_of(dropped, "unused value", "unused values");
  if (capped) summary += "; " + count_of(capped, "node", "nodes") + " over the size cap kept";
  return PassResult{true, summary};
}

}  // namespace kiln
