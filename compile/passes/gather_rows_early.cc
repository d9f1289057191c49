// gather_rows_early: a Gather of some rows (tokens) of a value that row-wise nodes computed
// moves in front of them, so that only the rows kept are computed. ViT classifies from its class
// token alone: Gather(LayerNorm(x), 0, axis 1) after the last block made the whole block, its
// MLP and the final norm run for 197 tokens where 1 is read; after this pass they run on one
// (the block's keys and values still on all of them).
//
// Gather(N(x, ...), i, axis a) = N(Gather(x, i, a), ...) where N's output rows along axis a,
// never the last axis (the features), each depend on the same rows of the inputs gathered and
// on the others whole:
// - LayerNormalization / RMSNormalization over axes after a: the input;
// - FusedMatMul by a 2-D B (one output): A and a Z of Y's shape (the bias and B whole);
// - elementwise Add, Sub, Mul, Div and one-input activations: each input with Y's rows (one
//   broadcast along a is left whole);
// - Attention without a mask, causal masking, rotary caches or past keys, gathered along the
//   queries: Q (the keys and values whole; each query's row reads them all as before).
// The Gather's indices are a constant; a scalar index (the axis removed) becomes a one-element
// Gather and a Squeeze after the moved node. The value gathered must be read by Gathers of the
// same rows alone (the copies merge). The pass repeats until no Gather moves.
#include <set>
#include <string_view>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/infer.h"

namespace kiln {

namespace {

// The axis of a Gather of constant rows, normalised, or nullopt.
std::optional<int64_t> gather_axis(const Graph& g, const Node& n) {
  if (n.op != "Gather" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) return std::nullopt;
  const Value& idx = g.value(n.inputs[1]);
  const Shape& x = g.value(n.inputs[0]).shape;
  if (!idx.is_constant() || idx.constant.is_packed() || idx.constant.rank() > 1 || !x.rank_known) return std::nullopt;
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return std::nullopt;
  return axis;
}

// Whether two Gathers take the same rows: the same axis and equal index constants.
bool same_rows(const Graph& g, const Node& a, const Node& b) {
  const std::optional<int64_t> aa = gather_axis(g, a), ba = gather_axis(g, b);
  if (!aa || !ba || *aa != *ba || a.inputs[0] != b.inputs[0]) return false;
  const Tensor& ai = g.value(a.inputs[1]).constant;
  const Tensor& bi = g.value(b.inputs[1]).constant;
  return ai.shape() == bi.shape() && ai.to_int64_vector() == bi.to_int64_vector();
}

enum class Rows { gather, whole, unknown };

// How input `v` of a node with output shape y relates to y's rows along `axis`.
Rows rows_of(const Graph& g, ValueId v, const Shape& y, int64_t axis) {
  const Shape& s = g.value(v).shape;
  if (!s.rank_known || s.rank() > y.rank()) return Rows::unknown;
  const int64_t at = axis - (y.rank() - s.rank());
  if (at < 0) return Rows::whole;  // broadcast: the input has no such axis
  const Dim& d = s.dims[static_cast<size_t>(at)];
  const Dim& rows = y.dims[static_cast<size_t>(axis)];
  if (d == rows && (d.is_known() || d.is_symbolic())) return Rows::gather;
  if (d.is_known() && d.value == 1) return Rows::whole;
  return Rows::unknown;
}

// The inputs of `n` to gather for the rows of its output along `axis`, or nullopt when `n` is
// not row-wise along it (the file's header).
std::optional<std::vector<size_t>> row_inputs(const Graph& g, const Node& n, int64_t axis) {
  static const std::set<std::string_view> kElementwise = {"Add", "Sub", "Mul", "Div", "Relu", "Gelu", "Sigmoid", "Tanh", "Erf",
                                                          "Neg", "Sqrt", "Exp", "HardSwish", "HardSigmoid", "LeakyRelu", "Clip"};
  if (!n.domain.empty() || n.outputs.size() != 1 || n.outputs[0] == kNoValue) return std::nullopt;
  const Shape& y = g.value(n.outputs[0]).shape;
  if (!y.rank_known || axis >= y.rank() - 1) return std::nullopt;
  std::vector<size_t> slots;
  const auto take = [&](size_t slot, bool may_be_whole) {
    const Rows r = rows_of(g, n.inputs[slot], y, axis);
    if (r == Rows::gather) slots.push_back(slot);
    return r == Rows::gather || (r == Rows::whole && may_be_whole);
  };
  if (n.op == "LayerNormalization" || n.op == "RMSNormalization") {
    int64_t first = n.attr_int("axis", -1);
    if (first < 0) first += y.rank();
    if (first <= axis || g.value(n.inputs[0]).shape.rank() != y.rank() || !take(0, false)) return std::nullopt;
    return slots;
  }
  if (n.op == "FusedMatMul") {
    if (n.inputs.size() < 2 || g.value(n.inputs[1]).shape.rank() != 2 || g.value(n.inputs[0]).shape.rank() != y.rank() || !take(0, false))
      return std::nullopt;
    if (n.inputs.size() > 3 && n.inputs[3] != kNoValue && !take(3, true)) return std::nullopt;
    return slots;
  }
  if (n.op == "Attention") {
    const int64_t query_axis = y.rank() == 3 ? 1 : 2;
    if (n.inputs.size() != 3 || axis != query_axis || n.attr_int("is_causal", 0) != 0 || !take(0, false)) return std::nullopt;
    return slots;
  }
  if (kElementwise.count(n.op)) {
    for (size_t slot = 0; slot < n.inputs.size(); ++slot)
      if (n.inputs[slot] != kNoValue && !take(slot, true)) return std::nullopt;
    if (slots.empty()) return std::nullopt;
    return slots;
  }
  return std::nullopt;
}

// Moves one Gather (and its copies) in front of the node it reads; false when none can move.
Result<bool> move_one(Graph& g) {
  Matcher m(g);
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& gather = g.nodes[i];
    const std::optional<int64_t> axis = gather_axis(g, gather);
    const ValueId d = axis ? gather.inputs[0] : kNoValue;
    const Node* n = d == kNoValue ? nullptr : m.def(d);
    if (!n || outputs.count(d)) continue;
    std::vector<size_t> copies;  // every reader of d: a Gather of these rows
    bool only_gathers = true;
    for (const Use& u : uses[static_cast<size_t>(d)]) {
      only_gathers = only_gathers && u.node != Use::kCaptured && u.slot == 0 && same_rows(g, g.nodes[u.node], gather);
      if (only_gathers && u.node != i) {
        copies.push_back(u.node);
        only_gathers = !outputs.count(g.nodes[u.node].outputs[0]);  // a copy that is a graph output keeps its name
      }
    }
    if (!only_gathers) continue;
    std::optional<std::vector<size_t>> slots = row_inputs(g, *n, *axis);
    if (!slots) continue;
    const bool scalar = g.value(gather.inputs[1]).constant.rank() == 0;
    const int64_t first_row = g.value(gather.inputs[1]).constant.as_int64(0);
    const ValueId y = gather.outputs[0];
    for (size_t c : copies) g.replace_all_uses(g.nodes[c].outputs[0], y);  // the copies' readers read y
    const ValueId rows = scalar ? g.add_constant(g.value(gather.inputs[1]).name + "_rows", Tensor::from<int64_t>({1}, {first_row}))
                                : gather.inputs[1];
    Rewrite rw(g);
    const Node& node = g.nodes[m.index(*n)];
    Node moved = node;
    for (size_t slot : *slots) {
      const ValueId in = node.inputs[slot];
      Node pick;
      pick.name = g.value(in).name + "_rows";
      pick.op = "Gather";
      pick.inputs = {in, rows};
      pick.outputs = {g.add_value(pick.name, g.value(in).dtype)};
      pick.set_attr("axis", *axis);
      moved.inputs[slot] = pick.outputs[0];
      rw.add(std::move(pick));
    }
    if (scalar) {  // the node keeps the axis, one row long; a Squeeze drops it as the Gather did
      moved.outputs = {g.add_value(g.value(y).name + "_row", g.value(y).dtype)};
      Node squeeze;
      squeeze.name = g.value(y).name + "_squeeze";
      squeeze.op = "Squeeze";
      squeeze.inputs = {moved.outputs[0], g.add_constant(squeeze.name + "_axes", Tensor::from<int64_t>({1}, {*axis}))};
      squeeze.outputs = {y};
      rw.add(std::move(squeeze));
    } else {
      moved.outputs = {y};
    }
    std::vector<size_t> matched = {m.index(*n), i};
    matched.insert(matched.end(), copies.begin(), copies.end());
    rw.replace(matched, std::move(moved));
    KILN_RETURN_IF_ERROR(rw.commit());
    KILN_RETURN_IF_ERROR(infer_graph(g).status());
    return true;
  }
  return false;
}

}  // namespace

Result<PassResult> gather_rows_early(Model& model, PassContext&) {
  size_t moved = 0;
  // Each move takes a node from behind a Gather: at most as many moves as nodes.
  for (const size_t most = model.graph.nodes.size(); moved < most; ++moved) {
    KILN_ASSIGN_OR_RETURN(bool again, move_one(model.graph));
    if (!again) break;
  }
  if (moved == 0) return PassResult{};
  return PassResult{true, "moved row Gathers in front of " + count_of(moved, "node", "nodes")};
}

}  // namespace kiln
