// kiln.qdwconv_u8s8_avx512: QFusedConv that is a channels-last depthwise 2-D convolution (one
// input and one output channel per group: MobileNetV2's, EfficientNet-B0's) on u8 activations,
// with AVX-512 VNNI's `vpdpbusd` summing four filter rows of a channel per lane (qdwconv.h).
// The sums start at −zx · Σw (what x's zero point adds, taken off as an integer, as oneDNN and
// the reference do), and the epilogue (the scale and the bias; ReLU, Clip or SiLU; the
// requantization) runs on each output column's registers. The threads share the output rows;
// each builds a row's quads in its own scratch, in L1.
#include <omp.h>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/qconv_util.h"
#include "runtime/cpu/qdwconv.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> qdwconv_declines(const KernelQuery& q) {
  if (auto why = u8_conv_declines(q)) return why;
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[3].shape.concrete();
  const int64_t c = xs[3];
  if (q.node.attr_int("group", 1) != c || ws[0] != c || ws[1] != 1) return "not depthwise (one channel per group in and out)";
  const int64_t stride = q.node.attr_ints("strides", {1, 1})[0];
  if (stride != 1 && stride != 2) return "strides other than 1 or 2";
  return std::nullopt;
}

// The default rule's share: oneDNN (brdgmm_dw, jit_int8) keeps the layers of 33 to 63
// channels, where most of a block's 64 lanes run empty, and the stride-2 ones of 64 channels or
// more over images 56 or more wide, where each output column builds two input columns' quads
// rather than one, but for a 3x3 with SiLU, whose values oneDNN writes in f32 for kiln's SiLU
// pass. On the 2-core AMX Xeon, one thread, 50-iteration profiles of the compiled
// int8 models (us, kiln against oneDNN): stride 2 onto 56x56x96 124 / 80 and 225 / 215, onto
// 28x28x144 34 / 31 and (5x5) 148 / 106; kiln's won the other 14 and 13 depthwise layers
// (56x56x144 98 / 112, 28x28x192 25 / 39, 14x14x672 with SiLU 99 / 129, 7x7x1152 43 / 69,
// stride 2 onto 14x14x192 9.0 / 11.6). 32 channels or fewer run in pair mode (qdwconv.h) and are
// kiln's at any stride and width: on the 2-core AVX512-FP16 Xeon (no AMX), max-autotune's
// timings, two searches at one and two threads each, kiln's was the faster at 112x112x32 with
// SiLU (EfficientNet-B0's: 177 against 272-338 us at one thread) and with Clip (MobileNetV2's:
// 79-82 against 141-172), 28x28x32 5x5, 14x14x32 stride 2 and 30x30x8 in all four, stride 2
// onto 28x28x24 and 28x28x32 (5x5) in seven of eight; 56x56x16 was a tie (oneDNN 0-10 %
// faster in three of four). With the last block of 96, 480 and 672 channels in pair mode too,
// the same searches over the int8 models put EfficientNet-B0's 3x3 stride 2 with SiLU onto
// 56x56x96 at 190 against oneDNN's 232 us (one thread) and 104 against 124 (two), its 5x5 one
// onto 28x28x144 at 1.07-1.17x oneDNN's, and MobileNetV2's onto 56x56x96 (ReLU6) at
// 1.08-1.13x. max-autotune times both.
std::optional<std::string> qdwconv_defers(const KernelQuery& q) {
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete();
  if (xs[3] <= qdw::kBlock / 2) return std::nullopt;
  if (xs[3] < qdw::kBlock) return "33 to 63 channels (oneDNN measured faster)";
  if (q.node.attr_ints("strides", {1, 1})[0] != 2 || xs[2] < 56) return std::nullopt;
  auto act = read_activation(q.node, "activation");
  if (act.ok() && act->kind == Activation::silu && q.inputs[3].shape.concrete()[3] == 3) return std::nullopt;
  return "stride 2 over an image 56 or more wide, not a 3x3 with SiLU (oneDNN measured faster)";
}

class QDwConvKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete(), ws = q.inputs[3].shape.concrete();
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(q.node, {xs[1], xs[2]}, {ws[2], ws[3]}, false));
    qdw::Params& p = p_;
    n_ = xs[0];
    p.h = xs[1], p.w = xs[2], p.c = xs[3], p.kh = ws[2], p.kw = ws[3];
    p.s = win.strides[0], p.pt = win.pads[0], p.pl = win.pads[1], p.oh = ys[1], p.ow = ys[2];
    p.blocks = (p.c + qdw::kBlock - 1) / qdw::kBlock;
    p.pair = p.c - (p.blocks - 1) * qdw::kBlock <= qdw::kBlock / 2;
    p.groups = (p.kh + qdw::kGroupRows - 1) / qdw::kGroupRows;
    const int32_t zx = constant_zero_point(q.inputs[2]);
    p.x_zero = static_cast<uint8_t>(zx);
    // Y's codes within what the packs saturate to 0..255 after.
    KILN_ASSIGN_OR_RETURN(const Requantize r, requantize(q, -1.f, 256.f));
    const float inv = r.inv, zy = r.zero;
    p.silu = r.silu, p.inv_y_scale = inv, p.y_zero = zy, p.lo = r.lo, p.hi = r.hi;

    // The weights as quads and the per-channel constants, in the sums' lane order: lane i of
    // vector v is channel 16·(i / 4) + 4·v + i % 4 of its block (qdwconv.h); in a pair-mode
    // block 16·(i % 8 / 4) + 4·v + i % 4, each half a column's.
    const Tensor& wt = *q.inputs[3].value;  // [C, 1, KH, KW]
    const int8_t* w = wt.data<int8_t>();
    const float sx = constant_scalar(q.inputs[1]);
    const std::vector<double> sw = q.inputs[4].value->to_double_vector();
    const bool has_bias = q.inputs.size() > 8 && q.inputs[8].dtype != DType::undefined;
    const float* bias = has_bias ? q.inputs[8].value->data<float>() : nullptr;
    weights_.assign(static_cast<size_t>(p.blocks * p.groups * p.kw * 4 * qdw::kBlock), 0);
    scale_.assign(static_cast<size_t>(p.blocks * qdw::kBlock), 0.f);
    bias_.assign(scale_.size(), 0.f);
    start_.assign(scale_.size(), 0);
    for (int64_t b = 0; b < p.blocks; ++b)
      for (int64_t v = 0; v < 4; ++v)
        for (int64_t i = 0; i < 16; ++i) {
          const bool pair = p.pair && b == p.blocks - 1;
          const int64_t ch = b * qdw::kBlock + 16 * ((pair ? i % 8 : i) / 4) + 4 * v + i % 4;
          if (ch >= p.c) continue;
          const size_t lane = static_cast<size_t>((b * 4 + v) * 16 + i);
          int32_t sum = 0;
          for (int64_t dy = 0; dy < p.kh; ++dy)
            for (int64_t dx = 0; dx < p.kw; ++dx) {
              const int8_t wv = w[(ch * p.kh + dy) * p.kw + dx];
              sum += wv;
              const int64_t g = dy / qdw::kGroupRows, k = dy % qdw::kGroupRows;
              weights_[static_cast<size_t>((((b * p.groups + g) * p.kw + dx) * 4 + v) * qdw::kBlock + i * 4 + k)] = wv;
            }
          // y = (Σ − zx·Σw) · scale + bias, the sums starting at −zx·Σw; in codes (no SiLU),
          // y · inv + zy.
          const float scale = sx * static_cast<float>(sw[sw.size() == 1 ? 0 : static_cast<size_t>(ch)]);
          const float offset = bias ? bias[ch] : 0.f;
          start_[lane] = -zx * sum;
          scale_[lane] = p.silu ? scale : scale * inv;
          bias_[lane] = p.silu ? offset : offset * inv + zy;
        }
    p.start = start_.data();
    p.weights = weights_.data();
    p.scale = scale_.data();
    p.bias = bias_.data();
    threads_ = std::max(1, q.target.threads);
    scratch_ = static_cast<size_t>((qdw::scratch_bytes(p) + 63) / 64 * 64);
    row_ = qdw::row_kernel(p);
    needs.workspace_bytes = static_cast<size_t>(threads_) * scratch_ + 64;
    return {};
  }

  Status run(KernelContext& ctx) override {
    const auto* x = static_cast<const uint8_t*>(ctx.input(0).raw());
    auto* y = static_cast<uint8_t*>(ctx.output(0).raw());
    const std::span<std::byte> ws = ctx.workspace();
    auto* scratch = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) / 64 * 64);
    const int64_t rows = n_ * p_.oh;
    const int t = static_cast<int>(std::min<int64_t>({threads_, pool_threads(), rows}));
#pragma omp parallel num_threads(t) if (t > 1)
    {
      WorkerSpan span;
      const int i = omp_get_thread_num();
      const auto [r0, r1] = even_share(rows, omp_get_num_threads(), i);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / p_.oh;
        row_(p_, x + b * p_.h * p_.w * p_.c, y + b * p_.oh * p_.ow * p_.c, r % p_.oh, scratch + static_cast<size_t>(i) * scratch_);
      }
    }
    return {};
  }

 private:
  qdw::Params p_;
  qdw::RowFn row_ = nullptr;
  int64_t n_ = 0;
  std::vector<int8_t> weights_;
  std::vector<int32_t> start_;
  std::vector<float> scale_, bias_;
  int threads_ = 1;
  size_t scratch_ = 0;  ///< bytes a thread
};

}  // namespace

void register_qdwconv(KernelRegistry& r) {
  CpuFeatures isa = isa_features(Isa::avx512);
  isa.avx512_vnni = true;
  r.add("QFusedConv", "cpu",
        KernelImpl{.name = "kiln.qdwconv_u8s8_avx512",
                   .declines = qdwconv_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<QDwConvKernel>(); },
                   .needs_isa = isa,
                   .defers = qdwconv_defers});
}

}  // namespace kiln::cpu
