// kiln.global_pool_f32_<isa>: GlobalAveragePool and GlobalMaxPool on channels-last f32 tensors
// ([N, spatial.., C], compile's channels_last layout): each image's pixels are rows of C, summed
// (or maxed) down the columns. oneDNN's pooling runs a batch-1 image on one thread; here the
// threads share each image's pixels (from kParallelValues values), each reducing its rows into
// its own row of C, and then share the channels to combine those rows (EfficientNet-B0's
// squeezes, a 112x112x32 image the largest, at two threads). kiln.qglobal_pool_<isa>:
// QGlobalAveragePool the same way on u8 / s8 codes (a quantized EfficientNet's squeezes).
// kiln.max_pool_f32_<isa>: MaxPool on channels-last f32 images (below).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> global_pool_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (auto why = f32_and_concrete(q)) return why;
  if (!nn::channels_last(q.node)) return "not channels-last";
  if (q.inputs[0].shape.rank() < 3) return "no spatial dims";
  return std::nullopt;
}

// Values from which the threads share an image's pixels: fewer cost more in the parallel
// region than they save (codes: four times as many, a quarter of the bytes).
constexpr int64_t kParallelValues = 1 << 15, kParallelCodes = 1 << 17;

// The global pools' loop over n images of `pixels` rows of c values: each image's pixels shared
// among up to `threads` threads (one when there are few), each reducing its rows into its own
// row of c partial results (`partial`, threads · c, each row first filled with `start`:
// reduce(image, r0, r1, row)), then its channels shared to combine them (combine(image,
// partial, rows, c0, c1): channels [c0, c1) of the image from `rows` rows of partial results).
template <class T, class Reduce, class Combine>
void share_pixels(int threads, int64_t n, int64_t pixels, int64_t c, T* partial, T start, Reduce reduce, Combine combine) {
  if (threads <= 1) {
    for (int64_t b = 0; b < n; ++b) {
      std::fill(partial, partial + c, start);
      reduce(b, int64_t{0}, pixels, partial);
      combine(b, partial, 1, int64_t{0}, c);
    }
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    WorkerSpan span;
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    T* mine = partial + t * c;
    for (int64_t b = 0; b < n; ++b) {
      const auto [r0, r1] = even_share(pixels, nt, t);
      std::fill(mine, mine + c, start);
      reduce(b, r0, r1, mine);
#pragma omp barrier
      const auto [c0, c1] = even_share(c, nt, t);
      combine(b, partial, nt, c0, c1);
#pragma omp barrier
    }
  }
}

// What both global pools' kernels know: the input [N, spatial.., C] (concrete) as N images of
// `pixels` rows of C values, and the target's threads.
class GlobalPoolBase : public Kernel {
 protected:
  explicit GlobalPoolBase(Isa isa) : rows_(row_kernels(isa)) {}
  void read_input(const KernelQuery& q) {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete();
    n_ = xs[0];
    c_ = xs.back();
    pixels_ = shape_numel(std::span(xs).subspan(1, xs.size() - 2));
    threads_ = std::max(1, q.target.threads);
  }
  /// The threads to share an image among: one below `from` values.
  int threads_from(int64_t from) const { return pixels_ * c_ >= from ? std::min(threads_, pool_threads()) : 1; }

  const RowKernels& rows_;
  int64_t n_ = 0, c_ = 0, pixels_ = 0;
  int threads_ = 1;
};

class GlobalPoolKernel final : public GlobalPoolBase {
 public:
  explicit GlobalPoolKernel(Isa isa) : GlobalPoolBase(isa) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    read_input(q);
    max_ = q.node.op == "GlobalMaxPool";
    needs.workspace_bytes = static_cast<size_t>(threads_ * c_) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* x = ctx.input(0).data<float>();
    float* y = ctx.output(0).data<float>();
    const float start = max_ ? -std::numeric_limits<float>::infinity() : 0.f;
    const float scale = max_ ? 1.f : 1.f / static_cast<float>(pixels_);
    share_pixels(
        threads_from(kParallelValues), n_, pixels_, c_, reinterpret_cast<float*>(ctx.workspace().data()), start,
        [&](int64_t b, int64_t r0, int64_t r1, float* row) { rows_.column_reduce(x + (b * pixels_ + r0) * c_, r1 - r0, c_, c_, row, max_); },
        [&](int64_t b, const float* partial, int rows, int64_t c0, int64_t c1) {
          float* out = y + b * c_;
          std::copy(partial + c0, partial + c1, out + c0);
          for (int u = 1; u < rows; ++u) rows_.column_reduce(partial + u * c_ + c0, 1, c1 - c0, c_, out + c0, max_);
          if (!max_)
            for (int64_t j = c0; j < c1; ++j) out[j] *= scale;
        });
    return {};
  }

 private:
  bool max_ = false;
};

// QGlobalAveragePool on the codes: their integer column sums (exact), each channel's mean then
// dequantized and quantized to y's scale as QuantizeLinear does (within one step of the
// reference, whose sum of dequantized values rounds).
class QGlobalPoolKernel final : public GlobalPoolBase {
 public:
  explicit QGlobalPoolKernel(Isa isa) : GlobalPoolBase(isa) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    read_input(q);
    sx_ = constant_scalar(q.inputs[1]);
    zx_ = constant_zero_point(q.inputs[2]);
    sy_ = constant_scalar(q.inputs[3]);
    zy_ = constant_zero_point(q.inputs[4]);
    x_u8_ = q.inputs[0].dtype == DType::u8;
    y_u8_ = q.outputs[0].dtype == DType::u8;
    needs.workspace_bytes = static_cast<size_t>(threads_ * c_) * sizeof(int32_t) + static_cast<size_t>(c_) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const auto* x = static_cast<const std::byte*>(ctx.input(0).raw());
    auto* y = static_cast<std::byte*>(ctx.output(0).raw());
    const double per_pixel = 1.0 / static_cast<double>(pixels_);
    auto* partial = reinterpret_cast<int32_t*>(ctx.workspace().data());
    float* means = reinterpret_cast<float*>(partial + threads_ * c_);  // an image's channel means, dequantized
    share_pixels(
        threads_from(kParallelCodes), n_, pixels_, c_, partial, int32_t{0},
        [&](int64_t b, int64_t r0, int64_t r1, int32_t* row) { rows_.qcolumn_sum(x + (b * pixels_ + r0) * c_, x_u8_, r1 - r0, c_, c_, row); },
        [&](int64_t b, const int32_t* partial, int rows, int64_t c0, int64_t c1) {
          for (int64_t j = c0; j < c1; ++j) {
            int64_t sum = 0;
            for (int u = 0; u < rows; ++u) sum += partial[u * c_ + j];
            means[j] = static_cast<float>((static_cast<double>(sum) * per_pixel - zx_) * sx_);
          }
          rows_.quantize(means + c0, y + b * c_ + c0, c1 - c0, sy_, zy_, y_u8_);
        });
    return {};
  }

 private:
  float sx_ = 1, sy_ = 1;
  int32_t zx_ = 0, zy_ = 0;
  bool x_u8_ = true, y_u8_ = true;
};

std::optional<std::string> qglobal_pool_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (!q.inputs[0].shape.is_concrete()) return "x's shape is not known";
  if (!nn::channels_last(q.node)) return "not channels-last";
  if (q.inputs[0].shape.rank() < 3) return "no spatial dims";
  for (size_t i = 1; i < 5; ++i)
    if (!q.inputs[i].value || q.inputs[i].value->numel() != 1) return "the scales and zero points are not constant scalars";
  return std::nullopt;
}

// kiln.max_pool_f32_<isa>: a 2-D MaxPool of channels-last f32 images (no Indices output), the
// channels the vector lanes, each output pixel's window taken in registers (RowKernels::max_pool),
// the threads sharing the output rows. oneDNN 2.6's AVX2 pooling of channels-last tensors took
// 1.68 ms for ResNet-50's 3x3 stride-2 pool over 112x112x64 (`ONEDNN_VERBOSE`: jit:avx2, acdb) on
// a Zen 3 core. kiln.max_pool_bf16_<isa> and kiln.max_pool_int8_<isa>: the same on bf16 images
// (a `--precision bf16` chain's: compared as the floats they are) and on u8 / s8 codes (a
// quantized model's), which oneDNN 2.6 pooled in 1.7-4 times the time (docs/architecture.md).
// `values`: the kernel's name for the dtypes it takes ("f32", "bf16", "int8": u8 and s8).
std::optional<std::string> max_pool_declines(const KernelQuery& q, Isa isa, const std::string& values) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (values == "f32") {
    if (auto why = f32_and_concrete(q)) return why;
  } else {
    const DType dt = q.inputs[0].dtype;
    if ((values == "int8" ? !is_int8(dt) : dt != DType::bf16) || q.outputs[0].dtype != dt) return "not " + values;
    if (!q.inputs[0].shape.is_concrete() || shape_numel(q.inputs[0].shape.concrete()) == 0) return "the input is empty or not concrete";
  }
  if (!nn::channels_last(q.node)) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not 2-D";
  if (q.outputs.size() > 1 && q.outputs[1].dtype != DType::undefined) return "the Indices output";
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete();
  if (!nn::resolve_window(q.node, {xs[1], xs[2]}, {}, q.node.attr_int("ceil_mode", 0) != 0).ok()) return "an invalid window";
  return std::nullopt;
}

class MaxPoolKernel final : public Kernel {
 public:
  explicit MaxPoolKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
    n_ = xs[0];
    h_ = xs[1];
    w_ = xs[2];
    c_ = xs[3];
    oh_ = ys[1];
    ow_ = ys[2];
    KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, {h_, w_}, {}, q.node.attr_int("ceil_mode", 0) != 0));
    win_ = {w.kernel[0], w.kernel[1], w.strides[0], w.strides[1], w.dilations[0], w.dilations[1], w.pads[0], w.pads[1]};
    const DType dt = q.inputs[0].dtype;
    const PoolValues values = dt == DType::bf16 ? PoolValues::bf16 : dt == DType::u8 ? PoolValues::u8 : dt == DType::i8 ? PoolValues::s8 : PoolValues::f32;
    pool_ = rows_.max_pool[static_cast<size_t>(values)];
    bytes_ = static_cast<int64_t>(dtype_size(dt));
    // One thread below kParallelValues compared values (the output times the window).
    threads_ = n_ * oh_ * ow_ * c_ * win_.kh * win_.kw >= kParallelValues ? std::max(1, q.target.threads) : 1;
    return {};
  }

  Status run(KernelContext& ctx) override {
    const auto* x = static_cast<const std::byte*>(ctx.input(0).raw());
    auto* y = static_cast<std::byte*>(ctx.output(0).raw());
    const int threads = std::min(threads_, pool_threads());
    // Rows u0 .. u1 of the batch's n · oh output rows, image by image.
    auto rows = [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1;) {
        const int64_t b = u / oh_, end = std::min(u1, (b + 1) * oh_);
        pool_(x + b * h_ * w_ * c_ * bytes_, h_, w_, c_, win_, y + b * oh_ * ow_ * c_ * bytes_, ow_, u - b * oh_, end - b * oh_);
        u = end;
      }
    };
    if (threads <= 1) {
      rows(0, n_ * oh_);
      return {};
    }
#pragma omp parallel num_threads(threads)
    {
      WorkerSpan span;
      const auto [u0, u1] = even_share(n_ * oh_, omp_get_num_threads(), omp_get_thread_num());
      rows(u0, u1);
    }
    return {};
  }

 private:
  const RowKernels& rows_;
  decltype(RowKernels::max_pool)::value_type pool_ = nullptr;
  int64_t n_ = 0, h_ = 0, w_ = 0, c_ = 0, oh_ = 0, ow_ = 0, bytes_ = 4;
  PoolWindow win_;
  int threads_ = 1;
};

}  // namespace

void register_pool(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (std::string values : {"f32", "bf16", "int8"})
      r.add("MaxPool", "cpu",
            KernelImpl{.name = "kiln.max_pool_" + values + "_" + isa_name(isa),
                       .declines = [isa, values](const KernelQuery& q) { return max_pool_declines(q, isa, values); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<MaxPoolKernel>(isa); },
                       .needs_isa = isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"})
      r.add(op, "cpu",
            KernelImpl{.name = std::string("kiln.global_pool_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return global_pool_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<GlobalPoolKernel>(isa); },
                       .needs_isa = isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("QGlobalAveragePool", "cpu",
          KernelImpl{.name = std::string("kiln.qglobal_pool_") + isa_name(isa),
                     .declines = [isa](const KernelQuery& q) { return qglobal_pool_declines(q, isa); },
                     .create = [isa](const KernelQuery&) { return std::make_unique<QGlobalPoolKernel>(isa); },
                     .needs_isa = isa_features(isa)});
}

}  // namespace kiln::cpu
