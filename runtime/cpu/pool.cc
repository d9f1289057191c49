// kiln.global_pool_f32_<isa>: GlobalAveragePool and GlobalMaxPool on channels-last f32 tensors
// ([N, spatial.., C], compile's channels_last layout): each image's pixels are rows of C, summed
// (or maxed) down the columns. oneDNN's pooling runs a batch-1 image on one thread; here the
// threads share each image's pixels (from kParallelValues values), each reducing its rows into
// its own row of C, and then share the channels to combine those rows (EfficientNet-B0's
// squeezes, a 112x112x32 image the largest, at two threads).
#include <omp.h>

#include <algorithm>
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
// region than they save.
constexpr int64_t kParallelValues = 1 << 15;

class GlobalPoolKernel final : public Kernel {
 public:
  explicit GlobalPoolKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete();
    n_ = xs[0];
    c_ = xs.back();
    pixels_ = shape_numel(std::span(xs).subspan(1, xs.size() - 2));
    max_ = q.node.op == "GlobalMaxPool";
    threads_ = std::max(1, q.target.threads);
    needs.workspace_bytes = static_cast<size_t>(threads_ * c_) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* x = ctx.input(0).data<float>();
    float* y = ctx.output(0).data<float>();
    float* partial = reinterpret_cast<float*>(ctx.workspace().data());
    const float start = max_ ? -std::numeric_limits<float>::infinity() : 0.f;
    const float scale = max_ ? 1.f : 1.f / static_cast<float>(pixels_);
    const int threads = pixels_ * c_ >= kParallelValues ? std::min(threads_, pool_threads()) : 1;
    auto finish = [&](float* out, int64_t c0, int64_t c1) {
      if (!max_)
        for (int64_t j = c0; j < c1; ++j) out[j] *= scale;
    };
    if (threads <= 1) {
      for (int64_t b = 0; b < n_; ++b) {
        float* out = y + b * c_;
        std::fill(out, out + c_, start);
        rows_.column_reduce(x + b * pixels_ * c_, pixels_, c_, c_, out, max_);
        finish(out, 0, c_);
      }
      return {};
    }
#pragma omp parallel num_threads(threads)
    {
      WorkerSpan span;
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      float* mine = partial + t * c_;
      for (int64_t b = 0; b < n_; ++b) {
        const auto [r0, r1] = even_share(pixels_, nt, t);
        std::fill(mine, mine + c_, start);
        rows_.column_reduce(x + (b * pixels_ + r0) * c_, r1 - r0, c_, c_, mine, max_);
#pragma omp barrier
        const auto [c0, c1] = even_share(c_, nt, t);
        float* out = y + b * c_;
        std::copy(partial + c0, partial + c1, out + c0);
        for (int u = 1; u < nt; ++u) rows_.column_reduce(partial + u * c_ + c0, 1, c1 - c0, c_, out + c0, max_);
        finish(out, c0, c1);
#pragma omp barrier
      }
    }
    return {};
  }

 private:
  const RowKernels& rows_;
  int64_t n_ = 0, c_ = 0, pixels_ = 0;
  int threads_ = 1;
  bool max_ = false;
};

}  // namespace

void register_global_pool(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"})
      r.add(op, "cpu",
            KernelImpl{.name = std::string("kiln.global_pool_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return global_pool_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<GlobalPoolKernel>(isa); },
                       .needs_isa = isa_features(isa)});
}

}  // namespace kiln::cpu
