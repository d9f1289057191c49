// fold_split_concat: a Concat that joins pieces of a Split along the same axis copies what the
// Split took apart. Two shapes of it:
//
//   Concat(.., S0, S1, .., Sn-1, ..)  with  S0..Sn-1 = Split(X), every piece in order
//     -> Concat(.., X, ..)                              (YOLO's C2f blocks: the split halves and
//                                                        the bottlenecks' outputs, joined)
//   Concat(U0, U1, S2)  with  S0, S1, S2 = Split(X), the same sizes, some pieces unchanged
//     -> ReplaceSlices(X, U0, U1; starts 0, 2)         (YOLO's detection head: the box pieces
//                                                        decoded, the class scores passed on)
//
// In the second, the unchanged pieces are never copied: the Split no longer writes them, and
// ReplaceSlices may write its output over X when X dies there (Kernel::overwrites_input), moving
// only the updates. A piece the Concat reads is dropped from the Split (an omitted output) when
// nothing else reads it; a Split left with no outputs goes. Sizes along the axis must be known.
#include <numeric>
#include <optional>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"

namespace kiln {

namespace {

// The normalized axis of a Concat or Split over values of rank `rank`, or -1.
int64_t axis_of(const Node& n, int64_t rank, int64_t def) {
  int64_t a = n.attr_int("axis", def);
  if (a < 0) a += rank;
  return a >= 0 && a < rank ? a : -1;
}

// The size of `v` along `axis`, or -1 when it is not known.
int64_t size_along(const Graph& g, ValueId v, int64_t axis) {
  const Shape& s = g.value(v).shape;
  if (v == kNoValue || !s.rank_known || axis >= s.rank()) return -1;
  const Dim& d = s.dims[static_cast<size_t>(axis)];
  return d.is_known() ? d.value : -1;
}

// The Split (every output present, each of known size along `axis`) that produces input `j` of
// the Concat `c` and splits along the same axis; else null.
const Node* split_of(const Matcher& m, const Node& c, size_t j, int64_t axis) {
  const Node* s = m.def(c.inputs[j], "Split");
  if (!s || !s->domain.empty() || s->inputs.empty()) return nullptr;
  const Graph& g = m.graph();
  const Shape& xs = g.value(s->inputs[0]).shape;
  if (!xs.rank_known || axis_of(*s, xs.rank(), 0) != axis) return nullptr;
  for (ValueId o : s->outputs)
    if (o == kNoValue || size_along(g, o, axis) < 0) return nullptr;
  return s;
}

}  // namespace

Result<PassResult> fold_split_concat(Model& model, PassContext&) {
  Graph& g = model.graph;
  size_t joined = 0, replaced = 0, kept = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op != "Concat" || !g.nodes[i].domain.empty() || g.nodes[i].outputs.size() != 1) continue;
    const Shape& ys = g.value(g.nodes[i].outputs[0]).shape;
    if (!ys.rank_known) continue;
    const int64_t axis = axis_of(g.nodes[i], ys.rank(), 0);
    if (axis < 0) continue;
    // Pieces passed through unchanged: the Concat is the Split's input with slices replaced.
    {
      const Matcher m(g);
      const Node& c = g.nodes[i];
      const Node* s = nullptr;
      for (size_t j = 0; j < c.inputs.size() && !s; ++j) {
        const Node* cand = split_of(m, c, j, axis);
        if (cand && cand->outputs.size() == c.inputs.size() && cand->outputs[j] == c.inputs[j]) s = cand;
      }
      if (s) {
        const ValueId x = s->inputs[0];
        bool fits = g.value(x).dtype == g.value(c.outputs[0]).dtype && g.value(x).shape == ys;
        std::vector<char> through(c.inputs.size(), 0);
        for (size_t k = 0; k < c.inputs.size() && fits; ++k) {
          fits = size_along(g, c.inputs[k], axis) == size_along(g, s->outputs[k], axis);
          through[k] = c.inputs[k] == s->outputs[k] && m.only_read_by(s->outputs[k], {&c}) &&
                       std::count(c.inputs.begin(), c.inputs.end(), c.inputs[k]) == 1;
        }
        const auto passed = static_cast<size_t>(std::count(through.begin(), through.end(), 1));
        if (fits && passed > 0 && passed < c.inputs.size()) {
          Node r;
          r.name = c.name;
          r.op = "ReplaceSlices";
          r.inputs = {x};
          r.outputs = c.outputs;
          r.sources = c.sources.empty() ? std::vector<std::string>{c.name} : c.sources;
          std::vector<int64_t> starts;
          int64_t at = 0;
          for (size_t k = 0; k < c.inputs.size(); ++k) {
            if (!through[k]) {
              r.inputs.push_back(c.inputs[k]);
              starts.push_back(at);
            }
            at += size_along(g, c.inputs[k], axis);
          }
          r.set_attr("axis", axis);
          r.set_attr("starts", starts);
          const size_t si = m.index(*s);
          for (size_t k = 0; k < through.size(); ++k)
            if (through[k]) g.nodes[si].outputs[k] = kNoValue;
          g.nodes[i] = std::move(r);
          ++replaced;
          kept += passed;
          continue;
        }
      }
    }
    // Runs of a Split's every piece, in order: its input. (The dataflow is read again after each
    // run folded, which changes who reads the pieces.)
    std::optional<Matcher> dataflow;
    for (size_t j = 0; j < g.nodes[i].inputs.size(); ++j) {
      if (!dataflow) dataflow.emplace(g);
      const Matcher& m = *dataflow;
      const Node& c = g.nodes[i];
      const Node* s = split_of(m, c, j, axis);
      if (!s || s->outputs[0] != c.inputs[j] || j + s->outputs.size() > c.inputs.size() ||
          !std::equal(s->outputs.begin(), s->outputs.end(), c.inputs.begin() + static_cast<std::ptrdiff_t>(j)) ||
          g.value(s->inputs[0]).dtype != g.value(c.outputs[0]).dtype)
        continue;
      const size_t si = m.index(*s), n = s->outputs.size();
      const ValueId x = s->inputs[0];
      // The pieces only this run reads leave the Split.
      for (size_t k = 0; k < n; ++k) {
        const ValueId o = s->outputs[k];
        if (m.only_read_by(o, {&c}) && std::count(c.inputs.begin(), c.inputs.end(), o) == 1) g.nodes[si].outputs[k] = kNoValue;
      }
      Node& cc = g.nodes[i];
      cc.inputs.erase(cc.inputs.begin() + static_cast<std::ptrdiff_t>(j), cc.inputs.begin() + static_cast<std::ptrdiff_t>(j + n));
      cc.inputs.insert(cc.inputs.begin() + static_cast<std::ptrdiff_t>(j), x);
      dataflow.reset();
      ++joined;
    }
    if (g.nodes[i].op == "Concat" && g.nodes[i].inputs.size() == 1) {  // all that is left is X
      g.nodes[i].op = "Identity";
      g.nodes[i].erase_attr("axis");
    }
  }
  if (joined + replaced == 0) return PassResult{};
  // Splits left without outputs go.
  std::erase_if(g.nodes, [](const Node& n) {
    return n.op == "Split" && n.domain.empty() && std::all_of(n.outputs.begin(), n.outputs.end(), [](ValueId o) { return o == kNoValue; });
  });
  drop_unused_values(g);
  std::string what;
  if (replaced)
    what = "made " + count_of(replaced, "ReplaceSlices", "ReplaceSlices") + " (" + count_of(kept, "piece", "pieces") + " passed through uncopied)";
  if (joined) what += std::string(what.empty() ? "" : "; ") + "read " + count_of(joined, "Split's input", "Splits' inputs") + " in place of all their pieces";
  return PassResult{true, what};
}

}  // namespace kiln
