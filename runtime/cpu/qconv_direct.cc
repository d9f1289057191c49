// kiln.qconv_direct_u8s8_avx512: QFusedConv over 4 input channels or fewer (an image's first
// layer, over RGB: MobileNetV2's, EfficientNet-B0's, YOLO's) on u8 activations, channels-last,
// with AVX-512 VNNI's `vpdpbusd` summing each 4-byte group of a window's row against its
// weights for 16 output channels a vector, the input read where it lies (qconv_direct.h). The
// epilogue (what x's zero point adds, zx · Σw, taken from the integer sums; the scale and the
// bias; ReLU, Clip or SiLU; the requantization) runs on the sums' registers, in the order of
// oneDNN's and the reference's arithmetic, so that a code rounds as theirs.
// On a CPU with AMX-INT8 it also takes 5 to 64 input channels with a filter larger than 1x1
// (YOLO's early layers), a u8 residual too: the image padded with x's zero point once a run,
// then 16 output pixels' window rows read from it a 64-byte chunk a tile row (qconv_direct_amx.cc),
// the tiles' sums finished as the registers are.
// The threads share the output rows (and the padded image's).
#include <omp.h>

#include <limits>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/qconv_direct.h"
#include "runtime/cpu/qconv_util.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

// qconv_direct_defers' bound: a window's four-byte groups (rows times groups a row).
constexpr int64_t kAmxMaxGroups = 24;

// The input channels the kernel takes on AMX tiles, over 4 (with 4 or fewer it runs on
// `vpdpbusd`, whose 4-byte groups waste less of a short window row than the tiles' 64-byte
// chunks: the stems over RGB of MobileNetV2, EfficientNet-B0 and YOLO took 1.45-1.59x the time
// of the VNNI kernel on tiles). With more, each block of 16 or 32 pixels passes all of B, which
// outgrows L1: ResNet-50's 3x3 layers of 64-256 channels took 1.0-1.9x oneDNN's time. Over 33
// to 64 channels the default rule takes only small products (qconv_direct_defers).
constexpr int64_t kAmxMaxChannels = 64;

// The most operations (2·M·N·K) of a convolution over 33 to 64 input channels that the default
// rule gives the kernel on AMX tiles.
constexpr int64_t kAmxWideOps = 100'000'000;

// Whether the kernel runs a convolution over more than 4 input channels, on AMX tiles: the
// target and this process have them, 64 input channels or fewer, a filter larger than 1x1
// (a pointwise one is kiln's GEMM's).
std::optional<std::string> amx_declines(const KernelQuery& q, int64_t channels, int64_t taps) {
  if (!q.target.cpu.amx || !CpuFeatures::host().amx) return "more than 4 input channels without AMX";
  if (channels > kAmxMaxChannels) return "more than " + std::to_string(kAmxMaxChannels) + " input channels";
  if (taps == 1) return "a 1x1 filter over more than 4 input channels (a product kiln's GEMM runs)";
  return std::nullopt;
}

std::optional<std::string> qconv_direct_declines(const KernelQuery& q) {
  if (auto why = u8_conv_declines(q, true)) return why;
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[3].shape.concrete();
  if (q.node.attr_int("group", 1) != 1) return "grouped";
  if (xs[3] <= 4 && q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined) return "a residual over 4 input channels or fewer";
  if (xs[3] > 4) {
    if (auto why = amx_declines(q, xs[3], ws[2] * ws[3])) return why;
  } else if (ws[3] * xs[3] > qcd::kMaxRowGroups * 4) {
    return "a window row of more than " + std::to_string(qcd::kMaxRowGroups * 4) + " bytes";
  }
  if (ws[2] > qcd::kMaxRows) return "more than " + std::to_string(qcd::kMaxRows) + " rows of filter";
  if (ws[0] > qcd::kLanes * qcd::kMaxVectors) return "more than " + std::to_string(qcd::kLanes * qcd::kMaxVectors) + " output channels";
  return std::nullopt;
}

// The default rule's share: on a CPU with AMX, oneDNN's int8 convolution (jit:avx512_core_amx_int8)
// takes windows of more than 24 four-byte groups (a 7x7 over RGB: 7 rows of 6), whose 64-byte
// tile rows it fills where `vpdpbusd` takes a group at a time. On the 2-core AMX Xeon, one-layer
// QDQ models over 224x224 RGB into 64 channels (`kiln profile --iters 100`, each build twice,
// us kiln / oneDNN, one thread then two): 7x7 stride 2 555-775 / 338-355 and 241-264 / 191
// (ResNet-50's stem in the model 549-551 / 339-359 at one thread); 5x5 (20 groups) 264-268 /
// 277-287 and 127-135 / 180-186; 3x3 180-183 / 183-189 and 92 / 95-99; into 32 channels, 3x3
// with SiLU 166-234 / 210-214 and 82-114 / 111-135, 5x5 with SiLU 213-298 / 306-336 and 116-118 /
// 183-185. Without AMX kiln's took every one (bench/README "Int8 first layers over RGB").
//
// Over more than 4 input channels (on AMX tiles) it takes every one: int8 YOLO's 3x3 layers of
// 16 and 32 input channels over 80x80 and 40x40 (medians of 3 alternated `kiln profile`
// rounds, us kiln / oneDNN at one thread, then at two): 37-149 / 65-227 and 22-79 / 48-157,
// 0.32-0.78 of oneDNN's time (those with a residual, whose zero point oneDNN 2.6 also
// compensates on every call, 0.32-0.45). Over 33 to 64 channels, those of kAmxWideOps operations or fewer:
// YOLO's 3x3 layers of 64 channels over 20x20 (29.5 MOP) took 0.72-0.90 of the time of
// kiln.qconv_windows_u8s8_avx512 (which gathers their windows first) at one thread and
// 0.65-0.97 at two (22-28 against 29-33 us, 13-19 against 19-21); ResNet-50's 56x56 ones (231
// MOP) 1.0-1.3x oneDNN's.
std::optional<std::string> qconv_direct_defers(const KernelQuery& q) {
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[3].shape.concrete();
  if (xs[3] > 32) {
    const std::vector<int64_t> ys = q.outputs[0].shape.concrete();
    if (2 * ys[0] * ys[1] * ys[2] * ws[0] * xs[3] * ws[2] * ws[3] > kAmxWideOps)
      return "oneDNN is faster over more than 32 input channels and 100 million operations";
    return std::nullopt;
  }
  if (xs[3] > 4) return std::nullopt;
  if (!q.target.cpu.amx) return std::nullopt;
  if (ws[2] * ((ws[3] * xs[3] + 3) / 4) > kAmxMaxGroups)
    return "a window of more than " + std::to_string(kAmxMaxGroups) + " four-byte groups on AMX (oneDNN measured faster)";
  return std::nullopt;
}

class QConvDirectKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete(), ws = q.inputs[3].shape.concrete();
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(q.node, {xs[1], xs[2]}, {ws[2], ws[3]}, false));
    qcd::Params& p = p_;
    n_ = xs[0];
    p.h = xs[1], p.w = xs[2], p.c = xs[3], p.kh = ws[2], p.kw = ws[3], p.cout = ws[0];
    p.s = win.strides[0], p.pt = win.pads[0], p.pl = win.pads[1], p.oh = ys[1], p.ow = ys[2];
    p.vectors = (p.cout + qcd::kLanes - 1) / qcd::kLanes;
    p.row_groups = (p.kw * p.c + 3) / 4;
    const int32_t zx = constant_zero_point(q.inputs[2]);
    p.x_zero = static_cast<uint8_t>(zx);
    // Y's codes within [0, 255] (the stores truncate them to bytes).
    KILN_ASSIGN_OR_RETURN(const Requantize r, requantize(q, 0.f, 255.f));
    const float inv = r.inv, zy = r.zero;
    p.silu = r.silu, p.inv_y_scale = inv, p.y_zero = zy, p.lo = r.lo, p.hi = r.hi;
    if (q.inputs.size() > 9 && q.inputs[9].dtype != DType::undefined) {
      // A residual (AMX only): the activation's clamp in codes before it is added, the codes'
      // bounds and a ReLU after it.
      KILN_ASSIGN_OR_RETURN(const Requantize bare, requantize(q, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()));
      KILN_ASSIGN_OR_RETURN(const ActivationSpec post, read_activation(q.node, "post_activation"));
      p.residual = true;
      p.act_lo = bare.lo, p.act_hi = bare.hi;
      p.lo = post.kind == Activation::relu ? std::max(0.f, zy) : 0.f, p.hi = 255.f;
      p.z_factor = constant_scalar(q.inputs[10]) * inv;
      p.z_zero = static_cast<float>(constant_zero_point(q.inputs[11]));
    }

    // The weights by window row, 4-byte group and vector (qconv_direct.h), and the per-channel
    // constants.
    const Tensor& wt = *q.inputs[3].value;  // [cout, c, kh, kw]
    const int8_t* w = wt.data<int8_t>();
    const float sx = constant_scalar(q.inputs[1]);
    const std::vector<double> sw = q.inputs[4].value->to_double_vector();
    const bool has_bias = q.inputs.size() > 8 && q.inputs[8].dtype != DType::undefined;
    const float* bias = has_bias ? q.inputs[8].value->data<float>() : nullptr;
    const int64_t lanes = p.vectors * qcd::kLanes;
    weights_.assign(static_cast<size_t>(p.kh * p.row_groups * lanes * 4), 0);
    zero_sums_.assign(static_cast<size_t>(lanes), 0);
    scale_.assign(static_cast<size_t>(lanes), 0.f);
    bias_.assign(scale_.size(), 0.f);
    for (int64_t o = 0; o < p.cout; ++o) {
      int32_t sum = 0;
      for (int64_t ky = 0; ky < p.kh; ++ky)
        for (int64_t b = 0; b < p.kw * p.c; ++b) {
          const int8_t wv = w[((o * p.c + b % p.c) * p.kh + ky) * p.kw + b / p.c];
          sum += wv;
          weights_[static_cast<size_t>(((ky * p.row_groups + b / 4) * lanes + o) * 4 + b % 4)] = wv;
        }
      // y = (Σ − zx·Σw) · scale + bias, then (after the SiLU) y · inv + zy in codes.
      zero_sums_[static_cast<size_t>(o)] = zx * sum;
      const float scale = sx * static_cast<float>(sw[sw.size() == 1 ? 0 : static_cast<size_t>(o)]), offset = bias ? bias[o] : 0.f;
      scale_[static_cast<size_t>(o)] = p.silu ? scale : scale * inv;
      bias_[static_cast<size_t>(o)] = p.silu ? offset : offset * inv + zy;
    }
    zero_line_.assign(static_cast<size_t>(qcd::zero_line_bytes(p)), p.x_zero);
    amx_ = p.c > 4;  // qconv_direct_declines: only on AMX tiles
    if (amx_) {
      // B's tiles: for each window row and 64-byte chunk of it, each vector's 16 groups × 16
      // lanes × 4 bytes.
      p.chunks = (p.kw * p.c + 63) / 64;
      p.hp = (p.oh - 1) * p.s + p.kh;
      p.wp = qcd::amx_padded_width(p);
      amx_weights_.assign(static_cast<size_t>(p.kh * p.chunks * p.vectors * 1024), 0);
      for (int64_t ky = 0; ky < p.kh; ++ky)
        for (int64_t b = 0; b < p.kw * p.c; ++b)
          for (int64_t o = 0; o < p.cout; ++o) {
            const int64_t tile = (ky * p.chunks + b / 64) * p.vectors + o / qcd::kLanes;
            amx_weights_[static_cast<size_t>(tile * 1024 + (b % 64 / 4) * 64 + (o % qcd::kLanes) * 4 + b % 4)] =
                w[((o * p.c + b % p.c) * p.kh + ky) * p.kw + b / p.c];
          }
      p.amx_weights = amx_weights_.data();
      padded_bytes_ = static_cast<size_t>(p.hp * p.wp * p.c);
    }
    p.weights = weights_.data();
    p.zero_sums = zero_sums_.data();
    p.scale = scale_.data();
    p.bias = bias_.data();
    p.zero_line = zero_line_.data();
    threads_ = std::max(1, q.target.threads);
    scratch_ = static_cast<size_t>(qcd::scratch_bytes(p));
    row_ = qcd::row_kernel(p);
    needs.workspace_bytes = amx_ ? static_cast<size_t>(n_) * padded_bytes_ + 64 : static_cast<size_t>(threads_) * scratch_;
    return {};
  }

  std::string label() const override { return amx_ ? "amx_tiles" : ""; }

  Status run(KernelContext& ctx) override {
    const auto* x = static_cast<const uint8_t*>(ctx.input(0).raw());
    const uint8_t* x_end = x + ctx.input(0).nbytes();
    auto* y = static_cast<uint8_t*>(ctx.output(0).raw());
    auto* scratch = reinterpret_cast<uint8_t*>(ctx.workspace().data());
    const int64_t rows = n_ * p_.oh;
    if (amx_) {  // each image padded (the threads sharing its rows), then its output rows
      const uint8_t* z = p_.residual ? static_cast<const uint8_t*>(ctx.input(9).raw()) : nullptr;
      const int64_t padded_rows = n_ * p_.hp, image = p_.h * p_.w * p_.c;
      const int t = static_cast<int>(std::min<int64_t>({threads_, pool_threads(), rows}));
#pragma omp parallel num_threads(t) if (t > 1)
      {
        WorkerSpan span;
        const int i = omp_get_thread_num(), parts = omp_get_num_threads();
        const auto [p0, p1] = even_share(padded_rows, parts, i);
        for (int64_t r = p0; r < p1; ++r)
          qcd::amx_pad(p_, x + r / p_.hp * image, scratch + r / p_.hp * padded_bytes_, r % p_.hp, r % p_.hp + 1);
#pragma omp barrier
        const auto [r0, r1] = even_share(rows, parts, i);
        for (int64_t r = r0; r < r1;) {  // runs of rows within one image
          const int64_t b = r / p_.oh, end = std::min(r1, (b + 1) * p_.oh);
          const int64_t image_out = b * p_.oh * p_.ow * p_.cout;
          qcd::amx_rows(p_, scratch + b * padded_bytes_, y + image_out, z ? z + image_out : nullptr, r % p_.oh, r % p_.oh + (end - r));
          r = end;
        }
      }
      return {};
    }
    const int t = static_cast<int>(std::min<int64_t>({threads_, pool_threads(), rows}));
#pragma omp parallel num_threads(t) if (t > 1)
    {
      WorkerSpan span;
      const int i = omp_get_thread_num();
      const auto [r0, r1] = even_share(rows, omp_get_num_threads(), i);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / p_.oh;
        row_(p_, x + b * p_.h * p_.w * p_.c, x_end, y + b * p_.oh * p_.ow * p_.cout, r % p_.oh, scratch + static_cast<size_t>(i) * scratch_);
      }
    }
    return {};
  }

 private:
  qcd::Params p_;
  qcd::RowFn row_ = nullptr;
  int64_t n_ = 0;
  std::vector<int8_t> weights_;
  std::vector<int32_t> zero_sums_;
  std::vector<float> scale_, bias_;
  std::vector<uint8_t> zero_line_;
  std::vector<int8_t> amx_weights_;
  bool amx_ = false;
  size_t padded_bytes_ = 0;  ///< an image's padded copy (AMX)
  int threads_ = 1;
  size_t scratch_ = 0;  ///< bytes a thread
};

}  // namespace

bool qconv_direct_takes(const KernelQuery& q) { return !qconv_direct_declines(q) && !qconv_direct_defers(q); }

void register_qconv_direct(KernelRegistry& r) {
  CpuFeatures isa = isa_features(Isa::avx512);
  isa.avx512_vnni = true;
  r.add("QFusedConv", "cpu",
        KernelImpl{.name = "kiln.qconv_direct_u8s8_avx512",
                   .declines = qconv_direct_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<QConvDirectKernel>(); },
                   .needs_isa = isa,
                   .defers = qconv_direct_defers});
}

}  // namespace kiln::cpu
