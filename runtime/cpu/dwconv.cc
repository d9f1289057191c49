// kiln.dwconv_f32_<isa>: depthwise 2-D convolution (Conv / FusedConv with one input and one
// output channel per group) on f32 tensors, with the fused epilogue applied per output row
// while it is in cache. Channels-first, oneDNN 2.6 runs these through im2col + GEMM, one
// channel at a time; a direct loop over zero-padded planes, vectorised along the output row,
// does far less. Channels-last, the channels are the vector lanes and the filters are packed
// [KH, KW, C] once at plan time; oneDNN's kernel there leaves a SiLU epilogue (EfficientNet's)
// to a second pass over the output, which this one applies while the row is in cache.
#include "formats/ops/nn_util.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> dwconv_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (auto why = x_form_decline(q)) return why;
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && (in.dtype != DType::f32 || !in.shape.is_concrete())) return "not f32 of known shape";
  const Shape& xs = q.inputs[0].shape;
  const Shape& ws = q.inputs[1].shape;
  if (xs.rank() != 4) return "not a 2-D convolution";
  const int64_t c = xs.dims[nn::channels_last(q.node) ? 3 : 1].value, group = q.node.attr_int("group", 1);
  if (group != c || ws.dims[0].value != c || ws.dims[1].value != 1) return "not depthwise (one channel per group in and out)";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  if (nn::channels_last(q.node) && ws.dims[2].value > kDwconvNhwcMaxRows)
    return "channels-last with a filter taller than " + std::to_string(kDwconvNhwcMaxRows) + " rows";
  for (int64_t d : q.node.attr_ints("dilations"))
    if (d != 1) return "dilated";
  const std::vector<int64_t> strides = q.node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1] || (strides[0] != 1 && strides[0] != 2)) return "strides other than 1 or 2";
  if (shape_numel(xs.concrete()) == 0) return "an empty input";
  return std::nullopt;
}

// The default rule's share of the channels-last ones: kiln takes the 3x3 and 5x5 ones (stride 1
// or 2) whose epilogue is transcendental (SiLU: the activation applied while each row is in
// cache, where oneDNN's post-ops lack it and a second pass over the output applies it) and
// whose output rows have at least as many columns with every tap inside the image as with taps
// in the padding. oneDNN keeps the rest: a piecewise-linear epilogue or none (MobileNetV2's Clip
// layers: 1.03-1.08x their time on kiln's), 7x7 filters, and rows mostly edge (5x5 stride 1 on
// 7 columns: 0.91-1.10x). In the compiled models, the least of 4-6 alternated profiles per
// node at one and two threads; docs/architecture.md has the table. max-autotune times both.
std::optional<std::string> dwconv_defers(const KernelQuery& q) {
  if (!nn::channels_last(q.node)) return std::nullopt;
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete();
  const int64_t k = ws[2];
  if ((k != 3 && k != 5) || ws[3] != k) return "oneDNN's channels-last depthwise kernel is as fast but on 3x3 and 5x5 filters";
  const Result<nn::Window> w = nn::resolve_window(q.node, {xs[1], xs[2]}, {k, k}, false);
  if (!w.ok()) return "an invalid window";
  const int64_t ow = w->out[1];
  const auto [j0, j1] = dwconv_inside_columns(xs[2], k, w->strides[1], w->pads[1], ow);
  if (2 * (j1 - j0) < ow) return "oneDNN's channels-last depthwise kernel is as fast on rows mostly of edge columns";
  const Result<ActivationSpec> act = read_activation(q.node, "activation");
  const Activation kind = act.ok() ? act->kind : Activation::none;
  if (kind == Activation::none || kind == Activation::relu || kind == Activation::leaky_relu || kind == Activation::clip)
    return "oneDNN's channels-last depthwise kernel applies a piecewise-linear epilogue faster";
  return std::nullopt;
}

class DwConvKernel final : public Kernel {
 public:
  explicit DwConvKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    last_ = nn::channels_last(q.node);
    std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
    const std::vector<int64_t> ws = q.inputs[1].shape.concrete();
    if (last_) {  // the logical [N, C, H, W] of the stored [N, H, W, C]
      xs = {xs[0], xs[3], xs[1], xs[2]};
      ys = {ys[0], ys[3], ys[1], ys[2]};
    }
    KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, {xs[2], xs[3]}, {ws[2], ws[3]}, false));
    n_ = xs[0], c_ = xs[1], h_ = xs[2], w_ = xs[3], kh_ = ws[2], kw_ = ws[3];
    s_ = w.strides[0], pt_ = w.pads[0], pl_ = w.pads[1], oh_ = ys[2], ow_ = ys[3];
    weights_ = *q.inputs[1].value;
    if (last_) {  // [C, 1, KH, KW] -> [KH, KW, C]
      Tensor packed(DType::f32, {kh_, kw_, c_});
      pack_dwconv_nhwc_filters(weights_.data<float>(), c_, kh_ * kw_, packed.data<float>());
      weights_ = std::move(packed);
    }
    has_bias_input_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
    if (q.node.op == "FusedConv") {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
      has_z_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    }
    if (!last_)
      needs.workspace_bytes = static_cast<size_t>(std::max(1, q.target.threads)) *
                              static_cast<size_t>(dwconv_scratch_floats(kh_, kw_, s_, oh_, ow_)) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* bias = has_bias_input_ ? ctx.input(2).data<float>() : nullptr;
    const float* z = has_z_ ? ctx.input(3).data<float>() : nullptr;
    if (last_)
      rows_.dwconv_nhwc(ctx.input(0).data<float>(), n_, h_, w_, c_, weights_.data<float>(), bias, kh_, kw_, s_, pt_, pl_,
                        ctx.output(0).data<float>(), oh_, ow_, z, act_, post_);
    else
      rows_.dwconv(ctx.input(0).data<float>(), n_ * c_, c_, h_, w_, weights_.data<float>(), bias, kh_, kw_, s_, pt_, pl_,
                   ctx.output(0).data<float>(), oh_, ow_, z, act_, post_, reinterpret_cast<float*>(ctx.workspace().data()));
    return {};
  }

 private:
  const RowKernels& rows_;
  Tensor weights_;  // [C, 1, KH, KW] as given, or [KH, KW, C] channels-last
  int64_t n_ = 0, c_ = 0, h_ = 0, w_ = 0, kh_ = 0, kw_ = 0, s_ = 1, pt_ = 0, pl_ = 0, oh_ = 0, ow_ = 0;
  bool last_ = false, has_bias_input_ = false, has_z_ = false;
  ActivationSpec act_, post_;
};

}  // namespace

void register_dwconv(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"Conv", "FusedConv"})
      r.add(op, "cpu",
            KernelImpl{.name = std::string("kiln.dwconv_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return dwconv_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<DwConvKernel>(isa); },
                       .needs_isa = isa_features(isa),
                       .defers = dwconv_defers});
}

}  // namespace kiln::cpu
