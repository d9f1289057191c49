// kiln.direct_conv_f32_<isa>: a direct 2-D convolution of few input channels, an image model's
// first layer (EfficientNet-B0's and YOLO's 3x3 stride 2 over RGB with a SiLU), channels-last.
// With three input channels there is little to multiply per output value (27 taps for a 3x3
// filter) and oneDNN 2.6's kernels for it reach 40-70 % of the FMA peak, a SiLU after it in a
// second pass over the output. Here the output channels are the vector lanes, the filters
// packed [KH, KW, C, K] once at plan time, each input value broadcast against them for a block
// of output pixels held in registers, and the epilogue applied to each output row while it is
// in cache (RowKernels::direct_conv). It reads X channels-last, or channels-first where the
// node says so (x_channels_first: compile's channels_last leaves an image as it comes for it),
// through the strides of either.
#include "formats/ops/nn_util.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

// The most input channels it takes: past a few, the product has enough depth for oneDNN's
// kernels (and kiln's GEMM and Winograd) to run near the peak.
constexpr int64_t kMaxInputChannels = 4;
// The values in a window from which kiln's GEMM runs a convolution whose windows tile the image
// (direct_conv_defers).
constexpr int64_t kPatchValues = 256;

std::optional<std::string> direct_conv_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.node.has_attr("x_parts")) return "X in parts (kiln's f32 GEMM reads them where they lie)";
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && (in.dtype != DType::f32 || !in.shape.is_concrete())) return "not f32 of known shape";
  if (!nn::channels_last(q.node)) return "channels-first";
  const Shape& xs = q.inputs[0].shape;
  if (xs.rank() != 4) return "not a 2-D convolution";
  const std::vector<int64_t> ws = q.inputs[1].shape.concrete();
  if (q.node.attr_int("group", 1) != 1) return "grouped";
  if (ws[1] > kMaxInputChannels) return "more than " + std::to_string(kMaxInputChannels) + " input channels";
  if (ws[0] % 16 != 0) return "output channels that are not a multiple of 16";
  if (ws[2] > kDirectConvMaxRows) return "a filter taller than " + std::to_string(kDirectConvMaxRows) + " rows";
  if (ws[1] * ws[3] > kDirectConvMaxTaps) return "more than " + std::to_string(kDirectConvMaxTaps) + " taps in a filter row";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  for (int64_t d : q.node.attr_ints("dilations"))
    if (d != 1) return "dilated";
  const std::vector<int64_t> strides = q.node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1]) return "unequal strides";
  if (shape_numel(xs.concrete()) == 0) return "an empty input";
  return std::nullopt;
}

// The default rule: where X comes channels-first (x_channels_first), kiln's kernel, the only one
// that reads it but for kiln's GEMM on patches (below); otherwise kiln's kernel where the
// epilogue is transcendental (EfficientNet's and YOLO's SiLU: applied while each output row is
// in cache, where oneDNN's post-ops lack it and a second pass over the output applies it);
// oneDNN's where it is piecewise-linear or absent (MobileNetV2's Clip, ResNet-50's ReLU), which
// it applies in its registers as kiln's does: there the two took the same time. In the compiled
// models, paired `kiln_bench_node_times` rounds with and without kiln's kernel (6 at each thread
// count, on a 2-core Xeon, family 6 model 106), kiln's time over oneDNN's: EfficientNet-B0
// 0.70 / 0.74 (one / two threads), YOLO 0.70 / 0.72, MobileNetV2 0.96 / 1.01, ResNet-50 (7x7)
// 0.98 / 1.06. max-autotune times both. Reading the image as it comes instead (the input
// Transpose gone), all four first layers are kiln's: the Transpose and the layer's time
// 0.62-0.96 of what it was at one thread, 0.86-0.95 at two (kiln_bench_node_times, paired
// rounds).
//
// But where the windows tile the image (a vision transformer's patch embedding: the filter as
// large as the stride, no padding) and a window holds 256 values or more, kiln's GEMM reads it
// as it comes too, as one product of its patches, the image copied once into rows: ViT-S/16's
// 16x16 filters over RGB (768 values) took 0.57-0.67 of kiln.direct_conv's time at one thread
// and 0.69-0.74 at two, 14x14 ones (588) 0.62 / 0.71, 10x10 ones (300) 0.90 / 0.84; 12x12 ones
// (432) tied, and 8x8 (192), 4x4 (48) and 2x2 ones lost, 1.10-1.9x (one such node over 216-224
// pixel images, 8 alternated `kiln profile` rounds each way).
std::optional<std::string> direct_conv_defers(const KernelQuery& q) {
  if (nn::x_channels_first(q.node) && windows_tile_image(q)) {
    const std::vector<int64_t> w = q.inputs[1].shape.concrete();
    if (w[1] * w[2] * w[3] >= kPatchValues) return "kiln's GEMM runs a convolution whose windows tile the image, on its patches";
  }
  if (nn::x_channels_first(q.node)) return std::nullopt;
  if (piecewise_linear_activation(q.node)) return "oneDNN's convolution applies a piecewise-linear epilogue as fast";
  return std::nullopt;
}

class DirectConvKernel final : public Kernel {
 public:
  explicit DirectConvKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
    const std::vector<int64_t> ws = q.inputs[1].shape.concrete();
    n_ = xs[0], k_ = ws[0], kh_ = ws[2], kw_ = ws[3];
    if (nn::x_channels_first(q.node)) {  // [N, C, H, W]: pixels 1 float apart, channels a plane
      c_ = xs[1], h_ = xs[2], w_ = xs[3];
      sy_ = w_, sx_ = 1, sc_ = h_ * w_;
    } else {  // [N, H, W, C]: pixels c_ floats apart, channels next to each other
      h_ = xs[1], w_ = xs[2], c_ = xs[3];
      sy_ = w_ * c_, sx_ = c_, sc_ = 1;
    }
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(q.node, {h_, w_}, {kh_, kw_}, false));
    s_ = win.strides[0], pt_ = win.pads[0], pl_ = win.pads[1], oh_ = ys[1], ow_ = ys[2];
    // [K, C, KH, KW] -> [KH, KW, C, K]: a tap's output channels contiguous, one vector load each.
    filters_ = Tensor(DType::f32, {kh_, kw_, c_, k_});
    const float* from = q.inputs[1].value->data<float>();
    float* to = filters_.data<float>();
    for (int64_t o = 0; o < k_; ++o)
      for (int64_t ch = 0; ch < c_; ++ch)
        for (int64_t i = 0; i < kh_; ++i)
          for (int64_t j = 0; j < kw_; ++j) to[((i * kw_ + j) * c_ + ch) * k_ + o] = from[((o * c_ + ch) * kh_ + i) * kw_ + j];
    has_bias_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
    if (q.node.op == "FusedConv") {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
      has_z_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    }
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* bias = has_bias_ ? ctx.input(2).data<float>() : nullptr;
    const float* z = has_z_ ? ctx.input(3).data<float>() : nullptr;
    rows_.direct_conv(ctx.input(0).data<float>(), n_, h_, w_, c_, h_ * w_ * c_, sy_, sx_, sc_, filters_.data<float>(), bias, k_, kh_,
                      kw_, s_, pt_, pl_, ctx.output(0).data<float>(), oh_, ow_, z, act_, post_);
    return {};
  }

 private:
  const RowKernels& rows_;
  Tensor filters_;  // [KH, KW, C, K]
  int64_t n_ = 0, h_ = 0, w_ = 0, c_ = 0, k_ = 0, kh_ = 0, kw_ = 0, s_ = 1, pt_ = 0, pl_ = 0, oh_ = 0, ow_ = 0;
  int64_t sy_ = 0, sx_ = 0, sc_ = 0;  // X's row, pixel and channel strides
  bool has_bias_ = false, has_z_ = false;
  ActivationSpec act_, post_;
};

}  // namespace

void register_direct_conv(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"Conv", "FusedConv"})
      r.add(op, "cpu",
            KernelImpl{.name = std::string("kiln.direct_conv_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return direct_conv_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<DirectConvKernel>(isa); },
                       .needs_isa = isa_features(isa),
                       .defers = direct_conv_defers});
}

}  // namespace kiln::cpu
