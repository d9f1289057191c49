// hoist_activations: an activation that only follows a node moving values about (Reshape,
// Transpose, Flatten, Squeeze, Unsqueeze) runs before that node instead, so that fuse_epilogues
// can make it the epilogue of the convolution or matrix product behind:
//
//   Conv -> Reshape -> Transpose -> Sigmoid   =>   Conv -> Sigmoid -> Reshape -> Transpose
//
// An activation is elementwise and those nodes only place values, so the result is the same,
// value for value. YOLO's detection head writes this: its 1x1 convolutions' outputs reshaped to
// [N, anchors, outputs, H, W], transposed to [N, anchors, H, W, outputs] and then passed through
// a Sigmoid, a pass over every box after the transpose's; hoisted, the convolution applies it
// while each tile is in cache. Only one-input activations move (Relu, LeakyRelu, Sigmoid, Tanh,
// HardSigmoid, HardSwish, Gelu), only over a node whose output the activation alone reads and
// whose input it alone reads, and only on f32 values.
#include <set>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/ops/epilogue.h"

namespace kiln {

namespace {

bool moves_values(const Node& n) {
  static const std::set<std::string> kOps = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"};
  return n.domain.empty() && kOps.count(n.op) && !n.inputs.empty() && n.outputs.size() == 1;
}

// Whether value `v` is read by node `reader` alone, through its input 0, and is no graph output.
bool read_only_by(const std::vector<std::vector<Use>>& uses, const std::set<ValueId>& outputs, ValueId v, size_t reader) {
  if (v == kNoValue || outputs.count(v)) return false;
  const std::vector<Use>& u = uses[static_cast<size_t>(v)];
  return u.size() == 1 && u[0].node == reader && u[0].slot == 0;
}

}  // namespace

Result<PassResult> hoist_activations(Model& model, PassContext&) {
  Graph& g = model.graph;
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  size_t hoisted = 0;
  for (bool changed = true; changed;) {  // a chain of movers takes one step per round
    changed = false;
    const std::vector<std::vector<Use>> uses = g.uses();
    std::vector<int64_t> producer(g.values.size(), -1);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (ValueId v : g.nodes[i].outputs)
        if (v != kNoValue) producer[static_cast<size_t>(v)] = static_cast<int64_t>(i);
    for (size_t a = 0; a < g.nodes.size(); ++a) {
      Node& act = g.nodes[a];
      if (act.inputs.size() != 1 || act.outputs.size() != 1 || act.op == "Clip" || !activation_of_node(act, 0.f, 0.f)) continue;
      const ValueId v = act.inputs[0];
      const int64_t l = v == kNoValue ? -1 : producer[static_cast<size_t>(v)];
      if (l < 0 || !moves_values(g.nodes[static_cast<size_t>(l)])) continue;
      Node& mover = g.nodes[static_cast<size_t>(l)];
      const ValueId u = mover.inputs[0];
      if (!read_only_by(uses, outputs, v, a) || !read_only_by(uses, outputs, u, static_cast<size_t>(l))) continue;
      if (g.value(u).dtype != DType::f32 || g.value(v).dtype != DType::f32) continue;
      // u -> mover -> v -> act -> w  becomes  u -> act -> v -> mover -> w, act taking the
      // mover's place in the order (u is ready there; nothing between them reads v or w).
      const ValueId w = act.outputs[0];
      act.inputs[0] = u;
      act.outputs[0] = v;
      mover.inputs[0] = v;
      mover.outputs[0] = w;
      g.value(v).shape = g.value(u).shape;
      std::swap(g.nodes[static_cast<size_t>(l)], g.nodes[a]);
      ++hoisted;
      changed = true;
      break;  // the uses and producers changed: look again
    }
  }
  if (hoisted == 0) return PassResult{};
  return PassResult{true, "moved " + count_of(hoisted, "activation", "activations") +
                              " ahead of a Reshape, Transpose, Flatten, Squeeze or Unsqueeze"};
}

}  // namespace kiln
