// gather_rows_early: a Gather or Slice of some rows (tokens) of a value that row-wise nodes
// computed moves in front of them, so that only the rows kept are computed. ViT classifies from its class
// token alone: Gather(LayerNorm(x), 0, axis 1) after the last block made the whole block, its
// MLP and the final norm run for 197 tokens where 1 is read; after this pass they run on one
// (the block's keys and values still on all of them). A decoder exported to return the last
// token's logits alone (hidden[:, -1:] before the head) gets the same for its final norm and
// LM head.
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
// The Gather's indices are a constant (a scalar index, the axis removed, becomes a one-element
// Gather and a Squeeze after the moved node); the Slice's starts, ends and steps are constants
// along one axis. The value must be read by such nodes picking the same rows alone (the copies
// merge). The pass repeats until nothing moves.
#include <set>
#include <string_view>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/infer.h"

namespace kiln {

namespace {

// The axis along which `n` picks rows, normalised: a Gather by constant indices, or a Slice of
// one axis by constant starts, ends and steps. nullopt for anything else.
std::optional<int64_t> picked_axis(const Graph& g, const Node& n) {
  if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty()) return std::nullopt;
  const Shape& x = g.value(n.inputs[0]).shape;
  if (!x.rank_known) return std::nullopt;
  int64_t axis = 0;
  if (n.op == "Gather") {
    if (n.inputs.size() != 2 || !int_constant(g, n.inputs[1])) return std::nullopt;
    axis = n.attr_int("axis", 0);
  } else if (n.op == "Slice") {
    const std::optional<SliceSpec> spec = constant_slice(g, n);
    if (!spec || spec->starts.size() != 1 || spec->steps[0] == 0) return std::nullopt;
    axis = spec->axes[0];
  } else {
    return std::nullopt;
  }
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return std::nullopt;
  return axis;
}

// Whether two nodes pick the same rows of the same value: the same op and axis, and equal
// constant operands.
bool same_rows(const Graph& g, const Node& a, const Node& b) {
  const std::optional<int64_t> aa = picked_axis(g, a), ba = picked_axis(g, b);
  if (!aa || !ba || *aa != *ba || a.op != b.op || a.inputs.size() != b.inputs.size() || a.inputs[0] != b.inputs[0]) return false;
  for (size_t i = 1; i < a.inputs.size(); ++i)
    if (a.inputs[i] != b.inputs[i] && (a.inputs[i] == kNoValue || b.inputs[i] == kNoValue ||
                                       g.value(a.inputs[i]).constant.shape() != g.value(b.inputs[i]).constant.shape() ||
                                       int_constant(g, a.inputs[i]) != int_constant(g, b.inputs[i])))
      return false;
  return true;
}

enum class Rows { pick, whole, unknown };

// How input `v` of a node with output shape y relates to y's rows along `axis`.
Rows rows_of(const Graph& g, ValueId v, const Shape& y, int64_t axis) {
  const Shape& s = g.value(v).shape;
  if (!s.rank_known || s.rank() > y.rank()) return Rows::unknown;
  const int64_t at = axis - (y.rank() - s.rank());
  if (at < 0) return Rows::whole;  // broadcast: the input has no such axis
  const Dim& d = s.dims[static_cast<size_t>(at)];
  const Dim& rows = y.dims[static_cast<size_t>(axis)];
  if (d == rows && (d.is_known() || d.is_symbolic())) return Rows::pick;
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
    if (r == Rows::pick) slots.push_back(slot);
    return r == Rows::pick || (r == Rows::whole && may_be_whole);
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

// Moves one Gather or Slice of rows (and its copies) in front of the node it reads; false when
// none can move.
Result<bool> move_one(Graph& g) {
  Matcher m(g);
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& picker = g.nodes[i];
    const std::optional<int64_t> axis = picked_axis(g, picker);
    const ValueId d = axis ? picker.inputs[0] : kNoValue;
    const Node* n = d == kNoValue ? nullptr : m.def(d);
    if (!n || outputs.count(d)) continue;
    std::vector<size_t> copies;  // every reader of d: a node picking these rows
    bool only_pickers = true;
    for (const Use& u : uses[static_cast<size_t>(d)]) {
      only_pickers = only_pickers && u.node != Use::kCaptured && u.slot == 0 && same_rows(g, g.nodes[u.node], picker);
      if (only_pickers && u.node != i) {
        copies.push_back(u.node);
        only_pickers = !outputs.count(g.nodes[u.node].outputs[0]);  // a copy that is a graph output keeps its name
      }
    }
    if (!only_pickers) continue;
    std::optional<std::vector<size_t>> slots = row_inputs(g, *n, *axis);
    if (!slots) continue;
    const bool scalar = picker.op == "Gather" && g.value(picker.inputs[1]).constant.rank() == 0;
    const ValueId y = picker.outputs[0];
    for (size_t c : copies) g.replace_all_uses(g.nodes[c].outputs[0], y);  // the copies' readers read y
    Node pick = picker;  // the same rows of each row input; a scalar index as one row
    pick.sources.clear();
    if (scalar) {
      const int64_t row = g.value(picker.inputs[1]).constant.as_int64(0);
      pick.inputs[1] = g.add_constant(g.value(picker.inputs[1]).name + "_rows", Tensor::from<int64_t>({1}, {row}));
    }
    Rewrite rw(g);
    const Node& node = g.nodes[m.index(*n)];
    Node moved = node;
    for (size_t slot : *slots) {
      const ValueId in = node.inputs[slot];
      Node p = pick;
      p.name = g.value(in).name + "_rows";
      p.inputs[0] = in;
      p.outputs = {g.add_value(p.name, g.value(in).dtype)};
      moved.inputs[slot] = p.outputs[0];
      rw.add(std::move(p));
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
  return PassResult{true, "moved row Gathers / Slices in front of " + count_of(moved, "node", "nodes")};
}

}  // namespace kiln
