// Core loss ops of the attention family: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
// (schemas and type/shape inference). Semantics are those of ONNX NegativeLogLikelihoodLoss-22
// and SoftmaxCrossEntropyLoss-13; see docs/ops/attention.md.
#include <string>

#include "formats/op_schema.h"

namespace kiln {
namespace loss {
namespace {

// Inputs: scores [N, C, d1..dk], target [N, d1..dk], weight [C] (optional).
// Outputs: loss (target's shape for reduction none, else a scalar), log_prob (scores' shape).
Status infer_loss(InferContext& ctx) {
  const Node& node = ctx.node();
  const std::string reduction = node.attr_string("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return ctx.error("reduction '" + reduction + "' is not one of none, sum, mean");
  const Shape &xs = ctx.shape(0), &ts = ctx.shape(1);
  if (xs.rank() >= 0 && xs.rank() < 2) return ctx.error("the input must have rank 2 or more, got " + std::to_string(xs.rank()));
  if (xs.rank() >= 0 && ts.rank() >= 0 && ts.rank() != xs.rank() - 1)
    return ctx.error("the target has rank " + std::to_string(ts.rank()) + " but the input has rank " + std::to_string(xs.rank()));
  if (ctx.has_input(2) && ctx.rank(2) >= 0 && ctx.rank(2) != 1)
    return ctx.error("the weight must be 1-D, got rank " + std::to_string(ctx.rank(2)));
  Shape loss_shape = ts;
  if (xs.rank() >= 2 && ts.rank() == xs.rank() - 1) {
    // target dims are the input's with the class dim removed; take the known one of each pair.
    for (int64_t i = 0; i < ts.rank(); ++i) {
      const Dim& td = ts.dims[static_cast<size_t>(i)];
      const Dim& xd = xs.dims[static_cast<size_t>(i == 0 ? 0 : i + 1)];
      if (td.is_known() && xd.is_known() && td.value != xd.value)
        return ctx.error("the target shape " + ts.str() + " does not match the input shape " + xs.str() + " without its class dim");
      if (!td.is_known() && xd.is_known()) loss_shape.dims[static_cast<size_t>(i)] = xd;
    }
  }
  if (ctx.has_input(2) && ctx.rank(2) == 1 && xs.rank() >= 2) {
    const Dim &wd = ctx.shape(2).dims[0], &cd = xs.dims[1];
    if (wd.is_known() && cd.is_known() && wd.value != cd.value)
      return ctx.error("the weight has " + std::to_string(wd.value) + " values but there are " + std::to_string(cd.value) + " classes");
  }
  ctx.set_output(0, ctx.dtype(0), reduction == "none" ? loss_shape : Shape(std::vector<Dim>{}));
  if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.dtype(0), xs);
  return {};
}

const std::vector<AttrSpec> kLossAttrs{
    {"ignore_index", AttrType::int64, false, "target value that contributes nothing (none)"},
    {"reduction", AttrType::string, false, "none, sum or mean (mean)"}};

}  // namespace
}  // namespace loss

void register_loss_ops(OpRegistry& r) {
  using namespace loss;
  using namespace types;
  const std::vector<TypeConstraint> loss_types = {input(0, kFloat, "the input"), input(1, kIndex, "the target"),
                                                  same_as(2, 0, "the weight")};
  r.add("", OpSchema{"NegativeLogLikelihoodLoss", "loss = -weight[t] * input[n, t, d...] for target t, reduced", 2, 3, 1, 1,
                     kLossAttrs, infer_loss}).traits.types = loss_types;
  r.add("", OpSchema{"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss of log-softmax over dim 1, optional log_prob output", 2,
                     3, 1, 2, kLossAttrs, infer_loss}).traits.types = loss_types;
}

}  // namespace kiln
