// fuse_concat: a channel Concat read only by pointwise convolutions goes; they read its inputs
// where they lie, as the parts of X (FusedConv's `x_parts`: input 0, then the inputs after Z).
//
//   Concat(A, B, C; channels) -> FusedConv 1x1(., W)   =>   FusedConv 1x1(A, W, bias, Z, B, C; x_parts 3)
//
// YOLO's C2f blocks end so (the split halves and the bottlenecks' outputs joined, then a 1x1
// convolution), as do its SPPF block and the neck's joins: the Concat wrote every input again
// and the convolution read the copy. kiln's f32 GEMM takes a product of A in parts, each part's
// steps of a K slice one after the other into the tile in L1; no other kernel reads them, so
// only the convolutions the default rule already gives that GEMM fuse: channels-last, 1x1,
// stride 1, no padding or groups, a constant f32 weight and a transcendental activation (SiLU,
// Sigmoid, GELU...: with a piecewise-linear one or none, oneDNN's convolution runs faster over
// many pixels and would lose the Concat for a slower kernel). The target needs AVX2; a Concat
// of more than 16 inputs stays. An f16 weight (`--precision fp16`) qualifies where the f16
// GEMM's rule leaves its convolution to f32 or it gains least from f16
// (gemm::f16_pointwise_fuses: YOLO's joins into 32 or fewer channels, or from 64 or fewer over
// 28x28 pixels or more), which kiln's f32 GEMM then takes, widened; the f16 GEMM reads no
// parts, so the others keep their Concat.
#include <algorithm>
#include <set>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/ops/epilogue.h"

namespace kiln {

namespace {

constexpr size_t kMaxParts = 16;  // the most parts kiln's GEMM takes (gemm::kMaxAParts)

// Whether node `n`, reading `x` at input 0 only, is a convolution that can take X in parts.
bool takes_parts(const Graph& g, const Node& n, ValueId x) {
  if (!pointwise_conv_of(g, n, x, true)) return false;
  const Result<ActivationSpec> act = read_activation(n, "activation");
  if (!act.ok()) return false;
  const Activation k = act->kind;
  if (k == Activation::none || k == Activation::relu || k == Activation::leaky_relu || k == Activation::clip) return false;
  return pointwise_fuses_in_f32(g, n);
}

}  // namespace

Result<PassResult> fuse_concat(Model& model, PassContext& ctx) {
  if (!ctx.target.cpu.avx2 || !ctx.target.cpu.fma) return PassResult{};
  Graph& g = model.graph;
  size_t concats = 0, convs = 0;
  std::vector<char> gone(g.nodes.size(), 0);
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& c = g.nodes[i];
    if (c.op != "Concat" || !c.domain.empty() || c.outputs.size() != 1 || c.inputs.size() < 2 || c.inputs.size() > kMaxParts) continue;
    const ValueId y = c.outputs[0];
    const Shape& ys = g.value(y).shape;
    if (outputs.count(y) || ys.rank() != 4 || g.value(y).dtype != DType::f32) continue;
    int64_t axis = c.attr_int("axis", 0);
    if (axis < 0) axis += 4;
    if (axis != 3) continue;
    const std::vector<Use>& readers = uses[static_cast<size_t>(y)];
    if (readers.empty() || std::any_of(readers.begin(), readers.end(), [&](const Use& u) {
          return u.slot != 0 || !takes_parts(g, g.nodes[u.node], y);
        }))
      continue;
    for (const Use& u : readers) {
      Node& conv = g.nodes[u.node];
      std::vector<ValueId> in = {c.inputs[0]};
      for (size_t k = 1; k < 4; ++k) in.push_back(conv.has_input(k) ? conv.inputs[k] : kNoValue);
      in.insert(in.end(), c.inputs.begin() + 1, c.inputs.end());
      conv.inputs = std::move(in);
      conv.set_attr("x_parts", static_cast<int64_t>(c.inputs.size()));
      for (const std::string& s : c.sources.empty() ? std::vector<std::string>{c.name} : c.sources)
        if (std::find(conv.sources.begin(), conv.sources.end(), s) == conv.sources.end()) conv.sources.push_back(s);
      ++convs;
    }
    gone[i] = 1;
    ++concats;
  }
  if (concats == 0) return PassResult{};
  size_t at = 0;
  std::erase_if(g.nodes, [&](const Node&) { return gone[at++] != 0; });
  drop_unused_values(g);
  return PassResult{true, "read " + count_of(concats, "Concat's inputs", "Concats' inputs") + " where they lie in " +
                              count_of(convs, "pointwise convolution", "pointwise convolutions")};
}

}  // namespace kiln
