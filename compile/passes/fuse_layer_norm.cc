// fuse_layer_norm: torch's LayerNorm decomposition (opsets before 17) -> LayerNormalization.
//
//   mean = ReduceMean(x, [-1]); c = Sub(x, mean); var = ReduceMean(Pow(c, 2), [-1])
//   y = Div(c, Sqrt(Add(var, eps))) [* scale] [+ bias]
//
// Every intermediate must be read by the pattern only (c by its Pow and Div); scale and bias
// must be constants of the last dim's size (ones and zeros stand in when absent).
#include <algorithm>

#include "compile/passes/match.h"
#include "compile/passes/patterns.h"

namespace kiln {

Result<size_t> fuse_layer_norm(Graph& g) {
  Matcher m(g);
  Rewrite rw(g);
  for (const Node& div : g.nodes) {
    if (div.op != "Div" || !div.domain.empty() || div.inputs.size() != 2) continue;
    const ValueId c = div.inputs[0];
    const Node* sqrt = m.def(div.inputs[1], "Sqrt");
    const Node* sub = m.def(c, "Sub");
    if (!sqrt || !sub || !m.only_read_by(div.inputs[1], {&div})) continue;
    const Node* add_eps = m.def(sqrt->inputs[0], "Add");
    if (!add_eps || !m.only_read_by(sqrt->inputs[0], {sqrt})) continue;
    ValueId var = add_eps->inputs[0], eps_v = add_eps->inputs[1];
    if (!m.scalar(eps_v)) std::swap(var, eps_v);
    const std::optional<float> eps = m.scalar(eps_v);
    const Node* var_mean = m.def(var, "ReduceMean");
    if (!eps || !var_mean || !m.only_read_by(var, {add_eps})) continue;
    const Node* pow = m.def(var_mean->inputs[0], "Pow");
    if (!pow || pow->inputs[0] != c || !m.is_scalar(pow->inputs[1], 2.0) || !m.only_read_by(var_mean->inputs[0], {var_mean}))
      continue;
    const ValueId x = sub->inputs[0];
    const Node* mean = m.def(sub->inputs[1], "ReduceMean");
    if (!mean_over_last(m, mean, x) || !mean_over_last(m, var_mean, var_mean->inputs[0]) || !m.only_read_by(sub->inputs[1], {sub}) ||
        !m.only_read_by(c, {pow, &div}))
      continue;
    const Shape& xs = g.value(x).shape;
    if (g.value(x).dtype != DType::f32 || !xs.rank_known || xs.dims.empty() || !xs.dims.back().is_known()) continue;
    const int64_t d = xs.dims.back().value;
    std::vector<const Node*> chain = {mean, sub, pow, var_mean, add_eps, sqrt, &div};
    // The affine part: y * scale, then + bias, each optional.
    ValueId y = div.outputs[0], scale = kNoValue, bias = kNoValue;
    if (const Node* mul = m.single_reader(y); mul && mul->op == "Mul" && per_feature(g, Matcher::other(*mul, y), d)) {
      scale = Matcher::other(*mul, y);
      chain.push_back(mul);
      y = mul->outputs[0];
    }
    if (const Node* add = m.single_reader(y); add && add->op == "Add" && per_feature(g, Matcher::other(*add, y), d)) {
      bias = Matcher::other(*add, y);
      chain.push_back(add);
      y = add->outputs[0];
    }
    const std::vector<size_t> idx = m.indices(chain);
    if (!rw.free(idx)) continue;
    if (scale == kNoValue) scale = g.add_constant(g.value(x).name + "_ln_scale", Tensor::from<float>({d}, std::vector<float>(static_cast<size_t>(d), 1.f)));
    Node ln;
    ln.name = div.name;
    ln.op = "LayerNormalization";
    ln.inputs = {x, scale};
    if (bias != kNoValue) ln.inputs.push_back(bias);
    ln.outputs = {y};
    ln.set_attr("axis", int64_t{-1});
    ln.set_attr("epsilon", static_cast<double>(*eps));
    rw.replace(idx, std::move(ln));
  }
  const size_t made = rw.count();
  KILN_RETURN_IF_ERROR(rw.commit());
  return made;
}

}  // namespace kiln
