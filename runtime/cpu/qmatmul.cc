// kiln.qmatmul_u8s8_avx512: QFusedMatMul (a quantized linear layer, what `kiln compile` makes of
// DQ -> MatMul / Gemm -> Q) on kiln's VNNI GEMM (runtime/cpu/gemm/lowp.h), on AMX tiles where
// the target has them (16 rows or more, 64 steps of K or more; `amx_tiles` in profiles): B
// packed once at plan time with its column sums (a compiled model stores it packed, and its
// session only sums the columns), A's u8 rows read in place, s32 sums turned into real values
// by the epilogue (scale a_scale · b_scale[n], A's zero point removed through the column sums,
// bias, activation) and requantized to u8 in the micro-kernel's store, or written as f32.
//
// The micro-kernel's store also adds a residual Z (dequantized, or f32 as it is) and the post
// activation; an s8 output (the xnnpack quantizer's) runs as a second pass over the f32 result
// in the workspace, on the row kernels. With `dequantize_output` (a u8 Q -> DQ pair that only
// an f32 op reads, lower_int8's) the store writes the requantized value dequantized again.
// s8 A (the xnnpack quantizer's activations) is shifted to u8 first (x + 128, its zero point
// too), which leaves the products unchanged. A's scale and zero point may be computed at run
// time (a dynamically quantized layer: DynamicQuantizeLinear's outputs): the N column scales
// are then formed on each run.
//
// kiln.qconv_u8s8_avx512: QFusedConv where it is that product (a channels-last 1x1 stride-1
// convolution: its pixels A's rows, its weight [N, C, 1, 1] Bᵀ), the same kernel.
//
// Both take a recorded `mc` (max-autotune's axis): the rows of A the VNNI kernel runs every
// panel of B over at a time, by default those whose rows of A and C fill a quarter of L2
// (gemm::u8s8_block_rows).
#include <cstring>

#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/linear.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

constexpr size_t kAlign = 64;
size_t up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Inputs past A must be constants, but Z (input 9) and, for a dynamically quantized layer, A's
// scale and zero point; B's zero points all zero.
std::optional<std::string> quantized_inputs_declines(const KernelQuery& q) {
  if (auto why = gemm::lowp_lacks(q.target.cpu, gemm::Lowp::u8s8)) return why;
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const InferInput& in = q.inputs[i];
    if (in.dtype == DType::undefined) continue;
    if (!in.shape.is_concrete()) return "input " + std::to_string(i) + " has no concrete shape";
    if (i > 2 && i != 9 && !in.value) return "input " + std::to_string(i) + " is computed at run time (B, the bias, Y's and Z's scales and zero points must be constant)";
  }
  if (shape_numel(q.inputs[3].shape.concrete()) == 0) return "B is empty (the reference writes the bias alone)";
  for (double z : q.inputs[5].value->to_double_vector())
    if (z != 0) return "B's zero points are not all zero";
  return std::nullopt;
}

std::optional<std::string> qmatmul_declines(const KernelQuery& q) {
  if (auto why = quantized_inputs_declines(q)) return why;
  if (q.inputs[3].shape.rank() != 2) return "B is not 2-D";
  if (q.inputs[0].shape.rank() < 1) return "A is a scalar";
  return std::nullopt;
}

// QFusedConv as the same product where it is one (channels-last, 1x1, stride 1, no padding).
std::optional<std::string> qconv_declines(const KernelQuery& q) {
  if (auto why = pointwise_declines(q, 3)) return why;
  if (auto why = quantized_inputs_declines(q)) return why;
  if (!q.inputs[1].value || !q.inputs[2].value) return "X's scale and zero point are computed at run time";
  return std::nullopt;
}

// The default rule's share of those convolutions: those whose input's zero point is not 0, at
// any thread count (oneDNN 2.6 takes a source zero point into its sums on every call: the input
// of a layer after SiLU or after a linear bottleneck, not after ReLU or ReLU6). Of such 1x1
// convolutions over more than 64 pixels in MobileNetV2, EfficientNet-B0 and YOLO quantized by
// `kiln quant` (`kiln compile --mode max-autotune`'s reports on the 2-core Xeon), kiln's kernel
// was the faster on 34 of 35 problems at one thread, in 0.14-0.96 of oneDNN's time (YOLO's
// 20x20 and 10x10 layers took oneDNN 40-50 us a call however small), and on 21 of 22 at two
// (MobileNetV2's and YOLO's) in 0.17-0.90; the models' default compiles took 0.79-0.91 of the
// time at one thread, MobileNetV2 and EfficientNet-B0 0.73 and 0.80 at two. Of the rest
// (ResNet-50's, whose inputs follow a ReLU): at one thread, those over 64 pixels or fewer,
// and those without a residual of 512 input channels or more; oneDNN the rest. ResNet-50's in
// the model (the median of three alternated profiles each, one thread): over 49 pixels
// 0.78-0.84 of oneDNN's time; 512 to 1024 channels into 128 or 256 without a residual
// 0.90-1.02; with a residual over 196-3136 pixels 1.10-1.34 (oneDNN's store is the better one
// there), and fewer channels over 3136 pixels 1.11-1.15. At two threads those it takes at one
// were 0.89-1.37 of oneDNN's time, the model 1.04x against 0.98x at one thread. Those were
// `vpdpbusd` against oneDNN; where kiln's kernel runs on AMX tiles (16 pixels or more, 64 input
// channels or more, on a CPU with AMX-INT8) it takes them all: on the 2-core AMX Xeon, with its
// u8 epilogues' rows decided once a product (U8s8Clamped) and its threads sharing a small B by
// rows, max-autotune's timings of int8 ResNet-50's pointwise problems gave kiln's 0.73-0.99 of
// oneDNN's time at one thread (the 11 of 13 timed on both) and 0.74-0.94 at two, but 7x7x2048
// -> 512's 1.06; the model took 0.97 / 0.94 of its time at one / two threads, MobileNetV2
// 0.96 / 0.95 (bench/README.md "Int8 residual epilogues on AMX").
std::optional<std::string> qconv_defers(const KernelQuery& q) {
  if (q.inputs[2].value && q.inputs[2].value->to_double_vector().at(0) != 0) return std::nullopt;
  const std::vector<int64_t> x = q.inputs[0].shape.concrete();
  if (gemm::u8s8_on_amx(q.target.cpu, shape_numel(x) / x.back(), x.back())) return std::nullopt;
  if (q.target.threads > 1) return "oneDNN is faster on pointwise int8 convolutions at more than one thread";
  if (shape_numel(x) / x.back() <= 64) return std::nullopt;
  if (q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined)
    return "oneDNN is faster on pointwise int8 convolutions with a residual over more than 64 pixels";
  if (x.back() < 512) return "oneDNN is faster on pointwise int8 convolutions of fewer than 512 input channels over more than 64 pixels";
  return std::nullopt;
}

// max-autotune's axis for the int8 GEMM: the rows of A a block runs every panel of B over.
std::vector<TuningAxis> qmatmul_space(const KernelQuery& q, bool pointwise) {
  Result<LinearDims> d = pointwise ? pointwise_dims(q, 3) : linear_dims(q, 3);
  if (!d.ok()) return {};
  return {size_axis("mc", {32, 64, 128, 256, 512, 1024, 2048}, std::max<int64_t>(d->m, 1))};
}

class QMatMulKernel final : public Kernel {
 public:
  /// `pointwise`: a QFusedConv that is a plain product (qconv_declines).
  explicit QMatMulKernel(bool pointwise) : pointwise_(pointwise) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    rows_ = &row_kernels(Isa::avx512);
    KILN_ASSIGN_OR_RETURN(const LinearDims d, pointwise_ ? pointwise_dims(q, 3) : linear_dims(q, 3));
    m_ = d.m, n_ = d.n, k_ = d.k;
    threads_ = std::max(1, q.target.threads);
    amx_ = gemm::u8s8_on_amx(q.target.cpu, m_, k_);
    // A's rows a block (max-autotune's parameter; the VNNI kernel's, AMX tiles block by the
    // cache sizes): recorded, or the default.
    mc_ = gemm::u8s8_block_rows(k_, n_, q.outputs[0].dtype == DType::u8 ? 1 : 4);
    if (const int64_t* mc = q.node.kernel.param<int64_t>("mc")) {
      if (*mc <= 0) return user_error(q.node.where(), "the recorded int8 GEMM parameter mc = " + std::to_string(*mc) + " is not positive");
      mc_ = (std::min<int64_t>(*mc, int64_t{1} << 40) + gemm::kLowpTile.mr - 1) / gemm::kLowpTile.mr * gemm::kLowpTile.mr;
    }
    // B packed once, with its column sums, or used where a compiled model mapped it when it
    // was stored packed so (the column sums then read from its panels).
    const Tensor& w = *q.inputs[3].value;
    const PackedLayout want = gemm::packed_b_s8_layout(k_, n_, d.trans);
    col_sums_.assign(static_cast<size_t>(n_), 0);
    if (w.layout() && w.layout()->same_placement(want)) {
      packed_ = w;
      gemm::packed_b_s8_column_sums(static_cast<const int8_t*>(w.raw()), k_, n_, col_sums_.data());
    } else {
      const Tensor plain = w.is_packed() ? unpack(w) : w;
      Tensor packed(DType::i8, {gemm::packed_b_s8_bytes(k_, n_)});
      gemm::pack_b_s8(plain.data<int8_t>(), d.trans ? k_ : n_, d.trans, k_, n_, packed.data<int8_t>(), col_sums_.data());
      packed_ = Tensor::packed(DType::i8, w.shape(), want, packed.nbytes(), packed.raw(),
                               std::shared_ptr<void>(std::make_shared<Tensor>(packed), packed.raw()));
    }
    // A's scale and zero point: constants, or (a dynamically quantized input) each run's.
    dynamic_ = !q.inputs[1].value || !q.inputs[2].value;
    if (shape_numel(q.inputs[1].shape.concrete()) != 1 || shape_numel(q.inputs[2].shape.concrete()) != 1)
      return user_error(q.node.where(), "a_scale and a_zero_point must be scalars");
    const std::vector<double> sb = q.inputs[4].value->to_double_vector();
    b_scales_.resize(static_cast<size_t>(n_));
    for (int64_t j = 0; j < n_; ++j) b_scales_[static_cast<size_t>(j)] = static_cast<float>(sb[sb.size() == 1 ? 0 : static_cast<size_t>(j)]);
    scales_.assign(static_cast<size_t>(n_), 0.f);
    a_s8_ = q.inputs[0].dtype == DType::i8;
    if (!dynamic_) set_a(constant_scalar(q.inputs[1]), constant_zero_point(q.inputs[2]));
    bias_.clear();
    if (q.inputs.size() > 8 && q.inputs[8].dtype != DType::undefined) {
      const float* b = q.inputs[8].value->data<float>();
      bias_.assign(b, b + n_);
    }
    KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
    has_z_ = q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined;
    z_f32_ = has_z_ && q.inputs[9].dtype == DType::f32;
    if (has_z_ && !z_f32_) {
      z_scale_ = constant_scalar(q.inputs[10]);
      z_zero_ = constant_zero_point(q.inputs[11]);
      z_u8_ = q.inputs[9].dtype == DType::u8;
    }
    out_int8_ = is_int8(q.outputs[0].dtype);
    out_u8_ = q.outputs[0].dtype == DType::u8;
    out_dq_ = q.node.attr_int("dequantize_output", 0) != 0;  // f32 out, quantized to u8 and back
    if (out_int8_ || out_dq_) {
      y_scale_ = constant_scalar(q.inputs[6]);
      y_zero_ = constant_zero_point(q.inputs[7]);
    }
    // The micro-kernel's store does it all: u8 or f32 out.
    direct_ = !out_int8_ || out_u8_;
    a_bytes_ = a_s8_ ? up(static_cast<size_t>(m_ * k_)) : 0;
    needs.workspace_bytes = a_bytes_ + (direct_ ? 0 : up(static_cast<size_t>(m_ * n_) * sizeof(float)));
    return {};
  }

  Status run(KernelContext& ctx) override {
    if (dynamic_) set_a(ctx.input(1).data<float>()[0], static_cast<int32_t>(ctx.input(2).as_int64(0)));
    std::byte* ws = ctx.workspace().data();
    const uint8_t* a = static_cast<const uint8_t*>(ctx.input(0).raw());
    if (a_s8_) {  // s8 + 128 as u8: flip the sign bit
      auto* shifted = reinterpret_cast<uint8_t*>(ws);
      for (int64_t i = 0; i < m_ * k_; ++i) shifted[i] = static_cast<uint8_t>(a[i] ^ 0x80u);
      a = shifted;
    }
    Tensor& y = ctx.output(0);
    gemm::QuantEpilogue ep;
    ep.col_sums = col_sums_.data();
    ep.a_zero = a_zero_;
    ep.scale = scales_.data();
    ep.bias = bias_.empty() ? nullptr : bias_.data();
    ep.act = act_;
    ep.post = post_;
    if (z_f32_) {
      ep.z_f32 = ctx.input(9).data<float>();
    } else if (has_z_) {
      ep.z_q = ctx.input(9).raw();
      ep.z_s8 = !z_u8_;
      ep.z_scale = z_scale_;
      ep.z_zero = z_zero_;
    }
    ep.ldz = n_;
    if (direct_) {
      ep.out_u8 = out_int8_;
      ep.out_dq = out_dq_;
      ep.out_scale = y_scale_;
      ep.out_zero = y_zero_;
      gemm::gemm_u8s8(m_, n_, k_, a, k_, static_cast<const int8_t*>(packed_.raw()), ep, y.raw(), n_, threads_, mc_, amx_);
      return {};
    }
    // An s8 output: f32 into the workspace, then quantized.
    auto* f = reinterpret_cast<float*>(ws + a_bytes_);
    gemm::gemm_u8s8(m_, n_, k_, a, k_, static_cast<const int8_t*>(packed_.raw()), ep, f, n_, threads_, mc_, amx_);
    rows_->quantize(f, y.raw(), m_ * n_, y_scale_, y_zero_, false);
    return {};
  }

  Tensor packed_input(size_t input) const override { return input == 3 ? packed_ : Tensor(); }
  // Each value of Z is read where Y's is then written, by the same thread: Y may be Z's memory.
  int overwrites_input() const override { return has_z_ ? 9 : -1; }

  std::vector<std::pair<std::string, KernelParam>> params() const override { return {{"mc", mc_}}; }
  std::string label() const override {
    std::string s = "u8s8_8x48_mc" + std::to_string(mc_);
    if (amx_) s += ", amx_tiles";
    return direct_ ? s : s + ", epilogue_pass";
  }

 private:
  // A's scale and zero point into the epilogue's per-column scales and A's (u8) zero point.
  void set_a(float scale, int32_t zero) {
    for (size_t j = 0; j < scales_.size(); ++j) scales_[j] = scale * b_scales_[j];
    a_zero_ = zero + (a_s8_ ? 128 : 0);
  }

  bool pointwise_ = false;
  const RowKernels* rows_ = nullptr;
  int64_t m_ = 0, n_ = 0, k_ = 0;
  int threads_ = 1;
  bool amx_ = false;  // the rows in whole 16s on AMX tiles (gemm::u8s8_on_amx)
  int64_t mc_ = 0;    // A's rows a block (resolved in prepare)
  Tensor packed_;
  std::vector<int32_t> col_sums_;
  std::vector<float> scales_, b_scales_, bias_;
  bool a_s8_ = false, dynamic_ = false;
  int32_t a_zero_ = 0;
  ActivationSpec act_, post_;
  bool has_z_ = false, z_f32_ = false, z_u8_ = true;
  float z_scale_ = 1;
  int32_t z_zero_ = 0;
  bool out_int8_ = false, out_u8_ = false, out_dq_ = false, direct_ = true;
  float y_scale_ = 1;
  int32_t y_zero_ = 0;
  size_t a_bytes_ = 0;
};

}  // namespace

void register_qmatmul(KernelRegistry& r) {
  CpuFeatures isa = isa_features(Isa::avx512);
  isa.avx512_vnni = true;
  r.add("QFusedMatMul", "cpu",
        KernelImpl{.name = "kiln.qmatmul_u8s8_avx512",
                   .declines = qmatmul_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<QMatMulKernel>(false); },
                   .needs_isa = isa,
                   .reads_packed = true,
                   .tuning_space = [](const KernelQuery& q) { return qmatmul_space(q, false); }});
  r.add("QFusedConv", "cpu",
        KernelImpl{.name = "kiln.qconv_u8s8_avx512",
                   .declines = qconv_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<QMatMulKernel>(true); },
                   .needs_isa = isa,
                   .defers = qconv_defers,
                   .tuning_space = [](const KernelQuery& q) { return qmatmul_space(q, true); }});
}

}  // namespace kiln::cpu
