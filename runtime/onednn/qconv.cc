// onednn.qconv: QFusedConv (what `kiln compile` makes of a quantized model's DQ -> conv -> Q)
// as a oneDNN int8 convolution: u8 or s8 activations, s8 weights, VNNI's `vpdpbusd` on this
// CPU (AMX where present), the whole epilogue in the kernel and the output written as int8.
//
// oneDNN 2.6's int8 arithmetic: acc = Σ (x − x_zero) · w in s32, plus the bias (added to the
// accumulator, so it is passed in accumulator units, B / (x_scale · w_scale)), times the output
// scale. kiln sets the output scale to x_scale · w_scale per output channel, which makes the
// value real: the activation post-op sees the same numbers as FusedConv's would; the residual Z
// is a sum post-op with Z's scale and zero point (Z copied into the destination first), then
// the post activation, then a linear post-op of 1 / y_scale that adds y's zero point, and
// oneDNN rounds to nearest even and saturates. Every epilogue FusedConv has is thus exact up to
// the final rounding (a tie rounds with the zero point added, so an odd one may move it a step):
// the output is within one quantization step of the reference.
//
// A SiLU with nothing after it (EfficientNet's and YOLO's convolutions) is the exception:
// oneDNN 2.6's swish post-op cost its int8 kernels about 1.5-2.7 cycles a value (YOLO's 3x3
// stride-2 80x80x32 layer 117 → 263 µs, EfficientNet-B0's 56x56x144 depthwise one 118 → 293 µs,
// one thread), so oneDNN writes the f32 values (scaled, biased) into the workspace and kiln's
// row kernels apply the SiLU and quantize them, a few thousand values at a time while they are
// in L1.
//
// Weights must be constant with zero zero points (the quantizers' symmetric weights); the
// scales and zero points must be constant. Channels-last tensors (what compile makes) are
// oneDNN's fastest int8 layout; channels-first ones run too.
#include <omp.h>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/rows.h"
#include "runtime/onednn/onednn.h"
#include "runtime/threads.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

memory::data_type int8_type(DType t) { return t == DType::u8 ? memory::data_type::u8 : memory::data_type::s8; }

std::optional<std::string> qconv_declines(const KernelQuery& q) {
  // Without it, oneDNN 2.6 sums pairs of u8 · s8 products in 16 bits (vpmaddubsw), which
  // saturate on full-range weights, and halves s8 activations' weights (rounding them).
  if (!q.target.cpu.avx512_vnni) return "the CPU lacks avx512-vnni (oneDNN's int8 products would saturate)";
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const InferInput& in = q.inputs[i];
    if (in.dtype == DType::undefined) continue;
    if (!in.shape.is_concrete()) return "input " + std::to_string(i) + " has no concrete shape";
    if (i != 0 && i != 9 && !in.value) return "input " + std::to_string(i) + " is computed at run time (weights, bias, scales and zero points must be constant)";
  }
  const int64_t rank = q.inputs[0].shape.rank();
  if (rank < 3 || rank > 5) return "only 1-D to 3-D convolutions";
  if (shape_numel(q.inputs[0].shape.concrete()) == 0) return "the input is empty";
  for (double z : q.inputs[5].value->to_double_vector())
    if (z != 0) return "the weights' zero points are not all zero";
  if (q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined && q.inputs[9].dtype != q.outputs[0].dtype)
    return "Z and Y have different types";
  return std::nullopt;
}

class QConvKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    return guarded(q.node, [&]() -> Status {
      const bool last = nn::channels_last(q.node);
      KILN_ASSIGN_OR_RETURN(const ConvGeometry geo, conv_geometry(q, 3));
      const std::vector<int64_t>&xs = geo.xs, &ys = geo.ys, &wdims = geo.wdims;
      const int64_t m = q.inputs[3].shape.concrete()[0];
      const memory::dims &strides = geo.strides, &dil = geo.dilations, &pad_l = geo.pad_l, &pad_r = geo.pad_r;
      KILN_ASSIGN_OR_RETURN(ActivationSpec act, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(ActivationSpec post, read_activation(q.node, "post_activation"));
      has_z_ = q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined;
      const std::optional<cpu::Isa> isa = cpu::best_isa(q.target.cpu);
      own_silu_ = act.kind == Activation::silu && !has_z_ && post.kind == Activation::none && isa;
      const memory::data_type xt = int8_type(q.inputs[0].dtype);
      const memory::data_type yt = own_silu_ ? memory::data_type::f32 : int8_type(q.outputs[0].dtype);
      const memory::desc src = last ? channels_last(xs, xt) : plain(xs, xt);
      const memory::desc dst = last ? channels_last(ys, yt) : plain(ys, yt);
      const memory::desc any_w(memory::dims(wdims.begin(), wdims.end()), memory::data_type::s8, memory::format_tag::any);

      // Output scales x_scale · w_scale[c]; the bias in accumulator units.
      const float sx = constant_scalar(q.inputs[1]);
      const std::vector<double> sw = q.inputs[4].value->to_double_vector();
      std::vector<float> scales(static_cast<size_t>(m));
      for (int64_t c = 0; c < m; ++c) scales[static_cast<size_t>(c)] = sx * static_cast<float>(sw[sw.size() == 1 ? 0 : static_cast<size_t>(c)]);
      has_bias_ = q.inputs.size() > 8 && q.inputs[8].dtype != DType::undefined;
      memory::desc bias_desc;
      if (has_bias_) {
        bias_ = Tensor(DType::f32, {m});
        const float* b = q.inputs[8].value->data<float>();
        for (int64_t c = 0; c < m; ++c) bias_.data<float>()[c] = scales[static_cast<size_t>(c)] != 0 ? b[c] / scales[static_cast<size_t>(c)] : 0.f;
        bias_desc = plain({m});
      }
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      attr.set_output_scales(1 << 1, scales);
      if (const int32_t zx = constant_zero_point(q.inputs[2]); zx != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {zx});
      // y's zero point is added by the last post-op rather than as oneDNN's destination zero
      // point, which its brgemm convolutions decline in 2.6: the older jit kernels they fell
      // back to took ResNet-50's downsampling convolutions (no activation, so a zero point)
      // 1.2-1.7x the time (231 → 137 µs for layer1's on AMX, one thread).
      const int32_t zy = constant_zero_point(q.inputs[7]);
      dnnl::post_ops ops;
      if (own_silu_) {  // kiln's SiLU and quantization after it (run)
        rows_ = &cpu::row_kernels(*isa);
        y_scale_ = constant_scalar(q.inputs[6]);
        y_zero_ = zy;
        y_u8_ = q.outputs[0].dtype == DType::u8;
        threads_ = std::max(1, q.target.threads);
      } else {
        if (!append_activation(ops, act)) return internal_error(q.node.where(), "no oneDNN post-op for the activation");
        if (has_z_) ops.append_sum(constant_scalar(q.inputs[10]), constant_zero_point(q.inputs[11]), yt);
        if (!append_activation(ops, post)) return internal_error(q.node.where(), "no oneDNN post-op for the post-activation");
        ops.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, 1.f / constant_scalar(q.inputs[6]), static_cast<float>(zy));
      }
      attr.set_post_ops(ops);

      dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, any_w,
                                           bias_desc, dst, strides, dil, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc pd(desc, attr, cpu_engine());
      // The weights reordered once into oneDNN's layout (with the compensation for x's zero
      // point that oneDNN keeps beside them).
      const Tensor& wt = *q.inputs[3].value;
      memory user_w(plain(wdims, memory::data_type::s8), cpu_engine(), const_cast<void*>(wt.raw()));
      weights_ = memory(pd.weights_desc(), cpu_engine());
      dnnl::reorder(user_w, weights_).execute(cpu_stream(), user_w, weights_);
      cpu_stream().wait();
      impl_ = pd.impl_info_str();
      prim_ = dnnl::convolution_forward(pd);
      src_ = memory(src, cpu_engine(), nullptr);
      dst_ = memory(dst, cpu_engine(), nullptr);
      if (has_bias_) bias_mem_ = memory(bias_desc, cpu_engine(), bias_.raw());
      scratch_ = memory(pd.scratchpad_desc(), cpu_engine(), nullptr);
      // The scratchpad, then (own_silu_) the f32 values from a 64-byte boundary.
      scratch_bytes_ = (pd.scratchpad_desc().get_size() + 63) / 64 * 64;
      needs.workspace_bytes = scratch_bytes_ + (own_silu_ ? static_cast<size_t>(shape_numel(ys)) * sizeof(float) : 0);
      return {};
    });
  }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      src_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      Tensor& y = ctx.output(0);
      const std::span<std::byte> ws = ctx.workspace();
      auto* values = own_silu_ ? reinterpret_cast<float*>(ws.data() + scratch_bytes_) : nullptr;
      dst_.set_data_handle(own_silu_ ? static_cast<void*>(values) : y.raw());
      if (has_z_ && y.raw() != ctx.input(9).raw()) parallel_copy(y.raw(), ctx.input(9).raw(), y.nbytes());  // the sum post-op's operand, unless Y is Z
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}};
      if (has_bias_) args.emplace(DNNL_ARG_BIAS, bias_mem_);
      execute(prim_, args, scratch_, ws.first(std::min(ws.size(), scratch_bytes_)));
      if (own_silu_) silu_and_quantize(values, y);
      return {};
    });
  }

  std::string label() const override { return own_silu_ ? impl_ + ", kiln silu" : impl_; }
  // The sum post-op adds to the destination: Y may be Z's memory.
  int overwrites_input() const override { return has_z_ ? 9 : -1; }

 private:
  // y = quantize(SiLU(values)), in stretches of kStretch values (in L1 between the two steps)
  // shared among the threads.
  void silu_and_quantize(float* values, Tensor& y) const {
    constexpr int64_t kStretch = 4096;
    const int64_t n = y.numel(), stretches = (n + kStretch - 1) / kStretch;
    const int t = static_cast<int>(std::min<int64_t>({threads_, pool_threads(), stretches}));
    auto* out = static_cast<std::byte*>(y.raw());
    const ActivationSpec silu{Activation::silu};
#pragma omp parallel num_threads(t) if (t > 1)
    {
      WorkerSpan span;
      const auto [s0, s1] = even_share(stretches, omp_get_num_threads(), omp_get_thread_num());
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t b = s * kStretch, count = std::min(kStretch, n - b);
        rows_->activation(values + b, values + b, count, silu);
        rows_->quantize(values + b, out + b, count, y_scale_, y_zero_, y_u8_);
      }
    }
  }

  dnnl::convolution_forward prim_;
  memory weights_, src_, dst_, bias_mem_, scratch_;
  Tensor bias_;
  bool has_bias_ = false, has_z_ = false;
  bool own_silu_ = false;  ///< oneDNN writes f32 values, kiln applies the SiLU and quantizes
  const cpu::RowKernels* rows_ = nullptr;
  float y_scale_ = 1;
  int32_t y_zero_ = 0;
  bool y_u8_ = true;
  int threads_ = 1;
  size_t scratch_bytes_ = 0;
  std::string impl_;  ///< oneDNN's implementation ("brg:avx512_core_vnni")
};

}  // namespace

void register_qconv(KernelRegistry& r) {
  r.add("QFusedConv", "cpu", KernelImpl{.name = "onednn.qconv",
                                        .declines = qconv_declines,
                                        .create = [](const KernelQuery&) { return std::make_unique<QConvKernel>(); }});
}

}  // namespace kiln::onednn
