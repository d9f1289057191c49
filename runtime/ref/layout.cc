// Reference kernels of channels-last nodes (layout.h).
#include "runtime/ref/layout.h"

#include <algorithm>
#include <cstring>

#include "formats/ops/nn_util.h"
#include "runtime/ref/nn_util.h"
#include "runtime/ref/shape_util.h"

namespace kiln::ref {

Tensor permuted(const Tensor& x, const std::vector<int64_t>& perm) {
  Tensor y(x.dtype(), nn::permute(x.shape(), perm));
  const std::vector<int64_t> in_strides = ref_shape::strides_of(x.shape());
  ref_shape::copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), y.shape(), nn::permute(in_strides, perm), 0);
  return y;
}

namespace {

// The node's channels-first view: inputs 0 (and Z: nn::layout_input) transposed, output 0
// written to a channels-first tensor the caller transposes back; everything else passes through.
ViewContext channels_first_view(KernelContext& outer) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < outer.num_inputs(); ++i) {
    if (!outer.has_input(i)) {
      inputs.emplace_back();
      continue;
    }
    const Tensor& x = outer.input(i);
    inputs.push_back(nn::layout_input(outer.node(), i) ? permuted(x, nn::channels_first_perm(static_cast<size_t>(x.rank()))) : x);
  }
  const Tensor& y = outer.output(0);
  return ViewContext(outer, outer.node(), std::move(inputs),
                     Tensor(y.dtype(), nn::permute(y.shape(), nn::channels_first_perm(static_cast<size_t>(y.rank())))));
}

}  // namespace

Status run_any_layout(KernelContext& ctx, KernelFn channels_first) {
  if (!nn::channels_last(ctx.node())) return channels_first(ctx);
  if (ctx.num_outputs() > 1 && ctx.output_allocated(1)) return ctx.error("a channels_last MaxPool has no Indices output");
  ViewContext first = channels_first_view(ctx);
  KILN_RETURN_IF_ERROR(channels_first(first));
  const Tensor& y = first.y();
  Tensor& out = ctx.output(0);
  if (out.shape() != nn::permute(y.shape(), nn::channels_last_perm(static_cast<size_t>(y.rank()))))
    return ctx.error("the channels-first kernel gave shape " + shape_str(y.shape()) + " for output " + shape_str(out.shape()));
  const std::vector<int64_t> strides = ref_shape::strides_of(y.shape());
  ref_shape::copy_strided(out.raw(), y.raw(), dtype_size(y.dtype()), out.shape(),
                          nn::permute(strides, nn::channels_last_perm(static_cast<size_t>(y.rank()))), 0);
  return {};
}

Status run_joined(KernelContext& ctx, KernelFn f) {
  if (!ctx.node().has_attr("x_parts")) return f(ctx);
  std::vector<const Tensor*> parts = {&ctx.input(0)};
  for (size_t i = 4; i < ctx.num_inputs(); ++i) parts.push_back(&ctx.input(i));
  const Tensor& x0 = *parts[0];
  const size_t axis = nn::channels_last(ctx.node()) ? static_cast<size_t>(x0.rank() - 1) : 1;
  std::vector<int64_t> shape = x0.shape();
  shape[axis] = 0;
  for (const Tensor* p : parts) shape[axis] += p->dim(static_cast<int64_t>(axis));
  Tensor x(x0.dtype(), shape);
  const size_t es = dtype_size(x0.dtype());
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const size_t row = static_cast<size_t>(shape[axis] * inner) * es;
  size_t col = 0;
  for (const Tensor* p : parts) {
    const size_t piece = static_cast<size_t>(p->dim(static_cast<int64_t>(axis)) * inner) * es;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<char*>(x.raw()) + static_cast<size_t>(o) * row + col,
                  static_cast<const char*>(p->raw()) + static_cast<size_t>(o) * piece, piece);
    col += piece;
  }
  Node node = ctx.node();
  node.erase_attr("x_parts");
  node.inputs.resize(std::min<size_t>(node.inputs.size(), 4));
  std::vector<Tensor> in = {x};
  for (size_t i = 1; i < std::min<size_t>(ctx.num_inputs(), 4); ++i) in.push_back(ctx.has_input(i) ? ctx.input(i) : Tensor());
  ViewContext view(ctx, std::move(node), std::move(in), ctx.output(0));  // writes the output in place
  return f(view);
}

Status run_widened(KernelContext& ctx, KernelFn f32) {
  const DType t = ctx.input(1).dtype();
  if (t == DType::f32) return f32(ctx);
  if (t != DType::bf16 && t != DType::f16) return ctx.error("the weight is " + std::string(dtype_name(t)) + ", not f32, bf16 or f16");
  const DType x = ctx.input(0).dtype(), yt = ctx.output(0).dtype();
  if (x != DType::f32 && !(x == DType::bf16 && t == DType::bf16))
    return ctx.error("a " + std::string(dtype_name(t)) + " weight needs an f32 input, not " + std::string(dtype_name(x)));
  if (yt != DType::f32 && !(yt == DType::bf16 && t == DType::bf16))
    return ctx.error("a " + std::string(dtype_name(t)) + " weight gives an f32 output, not " + std::string(dtype_name(yt)));
  std::vector<Tensor> in(ctx.num_inputs());
  for (size_t i = 0; i < in.size(); ++i)
    if (ctx.has_input(i)) in[i] = ctx.input(i);
  // bf16 activations (a FusedConv's): X and Z widened, Y rounded below.
  if (in.size() > 3 && in[3].defined() && in[3].dtype() == DType::bf16) in[3] = nn::to_f32(in[3]);
  if (x == DType::bf16) {
    in[0] = nn::to_f32(in[0]);
  } else if (t == DType::bf16) {
    Tensor a(DType::f32, in[0].shape());
    const float* xs = in[0].data<float>();
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = static_cast<float>(bfloat16(xs[i]));
    in[0] = a;
  }
  in[1] = nn::to_f32(in[1]);
  Tensor& y = ctx.output(0);
  if (y.dtype() == DType::f32) {
    ViewContext view(ctx, ctx.node(), std::move(in), y);  // writes the output in place
    return f32(view);
  }
  ViewContext view(ctx, ctx.node(), std::move(in), Tensor(DType::f32, y.shape()));
  KILN_RETURN_IF_ERROR(f32(view));
  nn::store_from_f32(view.y(), y);
  return {};
}

}  // namespace kiln::ref
