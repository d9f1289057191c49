// Reference kernels of the fused ops kiln compile makes: FusedConv is Conv, FusedMatMul is
// MatMul plus a bias along the last dim; both then run the epilogue of formats/ops/epilogue.h
// with the same scalar functions as the unary kernels (runtime/ref/activation.h).
#include "runtime/ref/activation.h"
#include "runtime/ref/nn_util.h"

namespace kiln::nn {

Status fused_epilogue(KernelContext& ctx, Tensor& y) {
  KILN_ASSIGN_OR_RETURN(ActivationSpec act, read_activation(ctx.node(), "activation"));
  KILN_ASSIGN_OR_RETURN(ActivationSpec post, read_activation(ctx.node(), "post_activation"));
  float* py = y.data<float>();
  const int64_t n = y.numel();
  act::apply(act, py, n);
  if (ctx.has_input(3)) {
    const Tensor& z = ctx.input(3);
    if (z.shape() != y.shape())
      return ctx.error("the residual input Z " + shape_str(z.shape()) + " does not have the output's shape " +
                       shape_str(y.shape()));
    const float* pz = z.data<float>();
    for (int64_t i = 0; i < n; ++i) py[i] += pz[i];
  }
  act::apply(post, py, n);
  return {};
}

}  // namespace kiln::nn
