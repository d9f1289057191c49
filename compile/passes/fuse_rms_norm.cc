// fuse_rms_norm: the RMSNorm of LLaMA-style models as exported -> RMSNormalization.
//
//   inv = Div(1, Sqrt(Add(ReduceMean(Pow(x, 2), [-1]), eps)))   (or Reciprocal(Sqrt(...)))
//   y = Mul(x, inv) [* scale]
//
// The intermediates must be read by the pattern only; the scale a constant of the last dim's
// size (ones stand in when absent).
#include <algorithm>

#include "compile/passes/match.h"
#include "compile/passes/patterns.h"

namespace kiln {

Result<size_t> fuse_rms_norm(Graph& g) {
  Matcher m(g);
  Rewrite rw(g);
  for (const Node& pow : g.nodes) {
    if (pow.op != "Pow" || !pow.domain.empty() || pow.inputs.size() != 2 || !m.is_scalar(pow.inputs[1], 2.0)) continue;
    const ValueId x = pow.inputs[0];
    const Node* mean = m.single_reader(pow.outputs[0]);
    if (!mean || !mean_over_last(m, mean, pow.outputs[0])) continue;
    const Node* add_eps = m.single_reader(mean->outputs[0]);
    if (!add_eps || add_eps->op != "Add") continue;
    const std::optional<float> eps = m.scalar(Matcher::other(*add_eps, mean->outputs[0]));
    const Node* sqrt = m.single_reader(add_eps->outputs[0]);
    if (!eps || !sqrt || sqrt->op != "Sqrt") continue;
    const Node* inv = m.single_reader(sqrt->outputs[0]);
    if (!inv || !((inv->op == "Reciprocal") ||
                  (inv->op == "Div" && inv->inputs[1] == sqrt->outputs[0] && m.is_scalar(inv->inputs[0], 1.0))))
      continue;
    const Node* mul = m.single_reader(inv->outputs[0]);
    if (!mul || mul->op != "Mul" || Matcher::other(*mul, inv->outputs[0]) != x) continue;
    const Shape& xs = g.value(x).shape;
    if (g.value(x).dtype != DType::f32 || !xs.rank_known || xs.dims.empty() || !xs.dims.back().is_known()) continue;
    const int64_t d = xs.dims.back().value;
    std::vector<const Node*> chain = {&pow, mean, add_eps, sqrt, inv, mul};
    ValueId y = mul->outputs[0], scale = kNoValue;
    if (const Node* sm = m.single_reader(y); sm && sm->op == "Mul" && per_feature(g, Matcher::other(*sm, y), d)) {
      scale = Matcher::other(*sm, y);
      chain.push_back(sm);
      y = sm->outputs[0];
    }
    const std::vector<size_t> idx = m.indices(chain);
    if (!rw.free(idx)) continue;
    if (scale == kNoValue)
      scale = g.add_constant(g.value(x).name + "_rms_scale", Tensor::from<float>({d}, std::vector<float>(static_cast<size_t>(d), 1.f)));
    Node rms;
    rms.name = pow.name;
    rms.op = "RMSNormalization";
    rms.inputs = {x, scale};
    rms.outputs = {y};
    rms.set_attr("axis", int64_t{-1});
    rms.set_attr("epsilon", static_cast<double>(*eps));
    rw.replace(idx, std::move(rms));
  }
  const size_t made = rw.count();
  KILN_RETURN_IF_ERROR(rw.commit());
  return made;
}

}  // namespace kiln
