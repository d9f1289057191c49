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
// kiln.qconv_windows_u8s8_avx512: any other channels-last QFusedConv without groups (filters
// larger than 1x1, strides, padding, dilations) as the product of its windows: each output
// pixel's window (KH·KW runs of C channels; X's zero point where it leaves the image, a real 0)
// gathered into a row of A in the workspace, the weight reordered to the windows' order and
// packed once at plan time (not stored packed: a compiled model keeps the weight as it was).
// On AMX tiles A's rows are gathered up to a whole 16, so that the tiles take the last few
// rows too (rather than the VNNI kernel reading all of B again for them).
//
// Both take a recorded `mc` (max-autotune's axis): the rows of A the VNNI kernel runs every
// panel of B over at a time, by default those whose rows of A and C fill a quarter of L2
// (gemm::u8s8_block_rows).
#include <cstring>

#include <omp.h>

#include "formats/huge_pages.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/linear.h"
#include "runtime/cpu/qconv_util.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

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

// The rows of windows kiln.qconv_windows_u8s8_avx512 gathers at most.
constexpr int64_t kMaxWindowBytes = int64_t{16} << 20;

std::optional<std::string> qconv_windows_declines(const KernelQuery& q) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4 || q.inputs[3].shape.rank() != 4) return "not 2-D";
  if (q.node.attr_int("group", 1) != 1) return "grouped";
  if (auto why = quantized_inputs_declines(q)) return why;
  if (!pointwise_declines(q, 3)) return "a pointwise convolution (kiln.qconv_u8s8_avx512's)";
  if (!q.inputs[1].value || !q.inputs[2].value) return "X's scale and zero point are computed at run time";
  const std::vector<int64_t> y = q.outputs[0].shape.concrete(), w = q.inputs[3].shape.concrete();
  if ((y[0] * y[1] * y[2] + 15) * w[1] * w[2] * w[3] > kMaxWindowBytes) return "its windows would take more than 16 MiB";
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

// The default rule's share of those convolutions, on a CPU with AMX-INT8 (its tiles take the
// windows' rows: 16 output pixels or more, 64 steps of K or more): a strided 1x1 one (its
// windows are the pixels it reads); on one thread, one whose weight outgrows L2 over a quarter
// as many pixels as output channels or fewer (streaming from memory each call, while kiln's
// tiles fetch each next panel ahead); and one of 64 input channels or more (no steps past the
// tiles' last 64) of kWindowsOps operations or fewer, where oneDNN's call costs more than its
// products. On the 2-core AMX Xeon, against oneDNN's convolution (jit/brgconv:
// avx512_core_amx_int8) in the int8 models (medians of 3 alternated `kiln profile` rounds, us
// kiln / oneDNN at one thread, then at two): ResNet-50's 3x3 512-channel layers over 7x7
// 215-223 / 229-302 (at two 137-149 / 115-157, so not taken there), its strided 1x1 ones 127-133
// / 147 and 81 / 95 (28x28), 119-125 / 158 and 83 / 92 (14x14), 194-236 / 270-294 and 117 / 133
// (7x7); YOLO's 3x3 layers over 20x20 and 10x10 (29-59 MOP) 28-67 / 48-79 and 23-46 / 40-64.
// oneDNN stays the faster on ResNet-50's other 3x3 layers (231 MOP over 14x14 to 56x56: 1.14-
// 2.3x kiln's time with their windows gathered) and on YOLO's over 40x40 and 80x80 (16-64
// channels: 1.1-2.6x); without AMX it is not measured against.
constexpr int64_t kWindowsOps = 100'000'000;

std::optional<std::string> qconv_windows_defers(const KernelQuery& q) {
  if (qconv_direct_takes(q)) return "kiln.qconv_direct_u8s8_avx512 is faster (no windows gathered: AMX tiles read them in the padded image)";
  const std::vector<int64_t> y = q.outputs[0].shape.concrete(), w = q.inputs[3].shape.concrete();
  const int64_t m = y[0] * y[1] * y[2], n = w[0], c = w[1], k = c * w[2] * w[3];
  if (!gemm::u8s8_on_amx(q.target.cpu, m, k)) return "oneDNN's convolution where the windows' product does not run on AMX tiles";
  if (w[2] * w[3] == 1) return std::nullopt;
  if (q.target.threads <= 1 && n * k >= gemm::CacheSizes::host().l2 && 4 * m <= n) return std::nullopt;
  if (c >= 64 && 2 * m * n * k <= kWindowsOps) return std::nullopt;
  return "oneDNN is faster on convolutions of fewer than 64 input channels or over 100 million operations whose weight fits L2 or "
         "that are more than a quarter of the output channels";
}

// max-autotune's axis for the int8 GEMM: the rows of A a block runs every panel of B over.
std::vector<TuningAxis> qmatmul_space(const KernelQuery& q, bool pointwise) {
  Result<LinearDims> d = pointwise ? pointwise_dims(q, 3) : linear_dims(q, 3);
  if (!d.ok()) return {};
  return {size_axis("mc", {32, 64, 128, 256, 512, 1024, 2048}, std::max<int64_t>(d->m, 1))};
}

// What QMatMulKernel multiplies: a linear layer's A, a pointwise convolution's pixels, or a
// convolution's windows.
enum class Form { linear, pointwise, windows };

class QMatMulKernel final : public Kernel {
 public:
  explicit QMatMulKernel(Form form) : form_(form) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    rows_ = &row_kernels(Isa::avx512);
    LinearDims d;
    if (form_ == Form::windows) {
      KILN_ASSIGN_OR_RETURN(win_, image_windows(q, 3));
      const std::vector<int64_t> ws = q.inputs[3].shape.concrete();
      d = LinearDims{.m = q.inputs[0].shape.concrete()[0] * win_.oh * win_.ow, .n = ws[0], .k = win_.k(), .trans = true};
    } else {
      KILN_ASSIGN_OR_RETURN(d, form_ == Form::pointwise ? pointwise_dims(q, 3) : linear_dims(q, 3));
    }
    m_ = d.m, n_ = d.n, k_ = d.k;
    threads_ = std::max(1, q.target.threads);
    amx_ = gemm::u8s8_on_amx(q.target.cpu, m_, k_);
    const bool windows = form_ == Form::windows;
    // A's rows a block (max-autotune's parameter; the VNNI kernel's, AMX tiles block by the
    // cache sizes): recorded, or the default.
    mc_ = gemm::u8s8_block_rows(k_, n_, q.outputs[0].dtype == DType::u8 ? 1 : 4);
    if (const int64_t* mc = q.node.kernel.param<int64_t>("mc")) {
      if (*mc <= 0) return user_error(q.node.where(), "the recorded int8 GEMM parameter mc = " + std::to_string(*mc) + " is not positive");
      mc_ = (std::min<int64_t>(*mc, int64_t{1} << 40) + gemm::kLowpTile.mr - 1) / gemm::kLowpTile.mr * gemm::kLowpTile.mr;
    }
    // B packed once, with its column sums, or used where a compiled model mapped it when it
    // was stored packed so (the column sums then read from its panels); a convolution's in its
    // windows' order, stored so where its input channels are a multiple of 4 (int8 ResNet-50's
    // session at one thread took 103 ms packing them all, 39 ms mapping them).
    const Tensor& w = *q.inputs[3].value;
    const std::optional<PackedLayout> want = windows ? gemm::packed_b_s8_windows_layout(n_, win_.c, win_.kh * win_.kw)
                                                     : gemm::packed_b_s8_layout(k_, n_, d.trans);
    col_sums_.assign(static_cast<size_t>(n_), 0);
    packed_ = want ? packed_before(q, w, *want, DType::i8) : Tensor();  // or as an earlier plan packed it
    if (packed_.defined()) {
      gemm::packed_b_s8_column_sums(static_cast<const int8_t*>(packed_.raw()), k_, n_, col_sums_.data());
    } else {
      Tensor plain = w.is_packed() ? unpack(w) : w;
      if (windows) plain = in_windows_order(plain.data<int8_t>(), DType::i8, n_, win_);
      Tensor packed = huge_page_tensor(DType::i8, {gemm::packed_b_s8_bytes(k_, n_)});
      gemm::pack_b_s8(plain.data<int8_t>(), d.trans ? k_ : n_, d.trans, k_, n_, packed.data<int8_t>(), col_sums_.data());
      packed_ = want ? packed.as_packed(DType::i8, w.shape(), *want) : packed;
      if (want) keep_packed(q, w, packed_);
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
    // A's rows in the workspace: s8 ones shifted, or the gathered windows (on AMX, up to a
    // whole 16 rows).
    a_rows_ = windows && amx_ ? (m_ + 15) / 16 * 16 : m_;
    a_bytes_ = a_s8_ || windows ? up(static_cast<size_t>(a_rows_ * k_)) : 0;
    needs.workspace_bytes = a_bytes_ + (direct_ ? 0 : up(static_cast<size_t>(m_ * n_) * sizeof(float)));
    return {};
  }

  Status run(KernelContext& ctx) override {
    if (dynamic_) set_a(ctx.input(1).data<float>()[0], static_cast<int32_t>(ctx.input(2).as_int64(0)));
    std::byte* ws = ctx.workspace().data();
    const uint8_t* a = static_cast<const uint8_t*>(ctx.input(0).raw());
    if (form_ == Form::windows) {
      gather(a, reinterpret_cast<uint8_t*>(ws));
      a = reinterpret_cast<const uint8_t*>(ws);
    } else if (a_s8_) {  // s8 + 128 as u8: flip the sign bit
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
      gemm::gemm_u8s8(m_, n_, k_, a, k_, static_cast<const int8_t*>(packed_.raw()), ep, y.raw(), n_, threads_, mc_, amx_, a_rows_ > m_);
      return {};
    }
    // An s8 output: f32 into the workspace, then quantized.
    auto* f = reinterpret_cast<float*>(ws + a_bytes_);
    gemm::gemm_u8s8(m_, n_, k_, a, k_, static_cast<const int8_t*>(packed_.raw()), ep, f, n_, threads_, mc_, amx_, a_rows_ > m_);
    rows_->quantize(f, y.raw(), m_ * n_, y_scale_, y_zero_, false);
    return {};
  }

  Tensor packed_input(size_t input) const override { return input == 3 && packed_.is_packed() ? packed_ : Tensor(); }
  // Each value of Z is read where Y's is then written, by the same thread: Y may be Z's memory.
  int overwrites_input() const override { return has_z_ ? 9 : -1; }

  std::vector<std::pair<std::string, KernelParam>> params() const override { return {{"mc", mc_}}; }
  std::string label() const override {
    std::string s = "u8s8_8x48_mc" + std::to_string(mc_);
    if (amx_) s += ", amx_tiles";
    if (form_ == Form::windows) s += ", windows";
    return direct_ ? s : s + ", epilogue_pass";
  }

 private:
  // Each output pixel's window into A's row of KH·KW runs of C channels (u8: an s8 X's shifted),
  // X's zero point (in u8) where the window leaves the image; the rows past M (AMX's padding)
  // are X's zero point too. The threads share the output's lines.
  void gather(const uint8_t* x, uint8_t* rows) const {
    const gemm::ImageWindows& s = win_;
    const auto pad = static_cast<uint8_t>(a_zero_);
    const uint8_t flip = a_s8_ ? 0x80 : 0;
    const size_t c = static_cast<size_t>(s.c);
    auto lines = [&](int64_t r0, int64_t r1) {  // rows r0..r1 of the output's images × OH
      auto fill = [&](uint8_t* to) { std::memset(to, pad, c); };
      if (flip)
        gather_windows(s, x, rows, r0, r1, [&](uint8_t* to, const uint8_t* from) { for (size_t i = 0; i < c; ++i) to[i] = from[i] ^ flip; }, fill);
      else
        gather_windows(s, x, rows, r0, r1, [&](uint8_t* to, const uint8_t* from) { std::memcpy(to, from, c); }, fill);
    };
    const int64_t all = m_ / s.ow;
    const int t = static_cast<int>(std::min<int64_t>(std::min(threads_, pool_threads()), all));
    if (t > 1 && m_ * k_ >= (int64_t{1} << 16)) {
#pragma omp parallel num_threads(t)
      {
        WorkerSpan span;
        const auto [r0, r1] = even_share(all, omp_get_num_threads(), omp_get_thread_num());
        lines(r0, r1);
      }
    } else {
      lines(0, all);
    }
    if (a_rows_ > m_) std::memset(rows + m_ * k_, pad, static_cast<size_t>((a_rows_ - m_) * k_));
  }

  // A's scale and zero point into the epilogue's per-column scales and A's (u8) zero point.
  void set_a(float scale, int32_t zero) {
    for (size_t j = 0; j < scales_.size(); ++j) scales_[j] = scale * b_scales_[j];
    a_zero_ = zero + (a_s8_ ? 128 : 0);
  }

  Form form_ = Form::linear;
  gemm::ImageWindows win_;  // Form::windows's
  const RowKernels* rows_ = nullptr;
  int64_t m_ = 0, n_ = 0, k_ = 0, a_rows_ = 0;
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
                   .create = [](const KernelQuery&) { return std::make_unique<QMatMulKernel>(Form::linear); },
                   .needs_isa = isa,
                   .reads_packed = true,
                   .tuning_space = [](const KernelQuery& q) { return qmatmul_space(q, false); }});
  r.add("QFusedConv", "cpu",
        KernelImpl{.name = "kiln.qconv_u8s8_avx512",
                   .declines = qconv_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<QMatMulKernel>(Form::pointwise); },
                   .needs_isa = isa,
                   .reads_packed = true,
                   .defers = qconv_defers,
                   .tuning_space = [](const KernelQuery& q) { return qmatmul_space(q, true); }});
  r.add("QFusedConv", "cpu",
        KernelImpl{.name = "kiln.qconv_windows_u8s8_avx512",
                   .declines = qconv_windows_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<QMatMulKernel>(Form::windows); },
                   .needs_isa = isa,
                   .reads_packed = true,
                   .defers = qconv_windows_defers});
}

}  // namespace kiln::cpu
