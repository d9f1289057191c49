// kiln.dwconv_f32_<isa>: depthwise 2-D convolution (Conv / FusedConv with one input and one
// output channel per group) on plain NCHW f32 tensors, with the fused epilogue applied per
// output row while it is in cache. oneDNN 2.6 runs these through im2col + GEMM, one channel at
// a time; a direct loop over zero-padded planes, vectorised along the output row, does far less.
#include "formats/ops/nn_util.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> dwconv_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (nn::channels_last(q.node)) return "channels-last (oneDNN's depthwise kernels run those)";
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && (in.dtype != DType::f32 || !in.shape.is_concrete())) return "not f32 of known shape";
  const Shape& xs = q.inputs[0].shape;
  const Shape& ws = q.inputs[1].shape;
  if (xs.rank() != 4) return "not a 2-D convolution";
  const int64_t c = xs.dims[1].value, group = q.node.attr_int("group", 1);
  if (group != c || ws.dims[0].value != c || ws.dims[1].value != 1) return "not depthwise (one channel per group in and out)";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  for (int64_t d : q.node.attr_ints("dilations"))
    if (d != 1) return "dilated";
  const std::vector<int64_t> strides = q.node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1] || (strides[0] != 1 && strides[0] != 2)) return "strides other than 1 or 2";
  if (shape_numel(xs.concrete()) == 0) return "an empty input";
  return std::nullopt;
}

class DwConvKernel final : public Kernel {
 public:
  explicit DwConvKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete(),
                               ys = q.outputs[0].shape.concrete();
    KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, {xs[2], xs[3]}, {ws[2], ws[3]}, false));
    n_ = xs[0], c_ = xs[1], h_ = xs[2], w_ = xs[3], kh_ = ws[2], kw_ = ws[3];
    s_ = w.strides[0], pt_ = w.pads[0], pl_ = w.pads[1], oh_ = ys[2], ow_ = ys[3];
    weights_ = *q.inputs[1].value;
    if (q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined && q.inputs[2].value) bias_ = *q.inputs[2].value;
    has_bias_input_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
    if (q.node.op == "FusedConv") {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
      has_z_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    }
    needs.workspace_bytes = static_cast<size_t>(std::max(1, q.target.threads)) *
                            static_cast<size_t>(dwconv_scratch_floats(kh_, kw_, s_, oh_, ow_)) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* bias = has_bias_input_ ? ctx.input(2).data<float>() : nullptr;
    rows_.dwconv(ctx.input(0).data<float>(), n_ * c_, c_, h_, w_, weights_.data<float>(), bias, kh_, kw_, s_, pt_, pl_,
                 ctx.output(0).data<float>(), oh_, ow_, has_z_ ? ctx.input(3).data<float>() : nullptr, act_, post_,
                 reinterpret_cast<float*>(ctx.workspace().data()));
    return {};
  }

 private:
  const RowKernels& rows_;
  Tensor weights_, bias_;
  int64_t n_ = 0, c_ = 0, h_ = 0, w_ = 0, kh_ = 0, kw_ = 0, s_ = 1, pt_ = 0, pl_ = 0, oh_ = 0, ow_ = 0;
  bool has_bias_input_ = false, has_z_ = false;
  ActivationSpec act_, post_;
};

}  // namespace

void register_dwconv(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"Conv", "FusedConv"})
      r.add(op, "cpu",
            KernelImpl{std::string("kiln.dwconv_f32_") + isa_name(isa), [isa](const KernelQuery& q) { return dwconv_declines(q, isa); },
                       [isa](const KernelQuery&) { return std::make_unique<DwConvKernel>(isa); }, isa_features(isa)});
}

}  // namespace kiln::cpu
