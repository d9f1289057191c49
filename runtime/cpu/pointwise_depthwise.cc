// kiln.pointwise_depthwise_f32_<isa>: PointwiseDepthwiseConv (compile's fuse_pointwise_depthwise:
// an inverted residual block's 1x1 expansion and the depthwise convolution after it) without
// the expanded tensor. Each thread takes output rows in order and keeps the expanded rows their
// filter rows read in a ring of KH (+ 1 for a pair of stride-1 rows) row buffers: a new output
// row computes only the expanded rows it is the first to read, kiln's GEMM over the input
// rows [rows · W, C] by the packed W1 with the pointwise epilogue, straight into their buffers,
// and the depthwise rows read them from L2 (RowKernels::dwconv_nhwc_rows). MobileNetV2's
// 112x112 expansion to 96 channels wrote 4.8 MB that its depthwise convolution read back.
#include <omp.h>

#include <array>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> pointwise_depthwise_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && (in.dtype != DType::f32 || !in.shape.is_concrete())) return "not f32 of known shape";
  if (!nn::channels_last(q.node)) return "not channels-last";
  if (q.inputs.size() < 4 || q.inputs[0].shape.rank() != 4) return "not a 2-D convolution";
  if (!q.inputs[1].value || !q.inputs[3].value) return "the weights are computed at run time";
  const std::vector<int64_t> w2 = q.inputs[3].shape.concrete();
  if (w2[2] > kDwconvNhwcMaxRows) return "a filter taller than " + std::to_string(kDwconvNhwcMaxRows) + " rows";
  for (int64_t d : q.node.attr_ints("dilations"))
    if (d != 1) return "dilated";
  const std::vector<int64_t> strides = q.node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1] || (strides[0] != 1 && strides[0] != 2)) return "strides other than 1 or 2";
  if (shape_numel(q.inputs[0].shape.concrete()) == 0 || shape_numel(q.outputs[0].shape.concrete()) == 0) return "an empty tensor";
  return std::nullopt;
}

class PointwiseDepthwiseKernel final : public Kernel {
 public:
  explicit PointwiseDepthwiseKernel(Isa isa) : isa_(isa), rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
    const std::vector<int64_t> w1 = q.inputs[1].shape.concrete(), w2 = q.inputs[3].shape.concrete();
    n_ = xs[0], h_ = xs[1], w_ = xs[2], c_ = xs[3], m_ = w1[0], kh_ = w2[2], kw_ = w2[3], oh_ = ys[1], ow_ = ys[2];
    if (w1[1] != c_ || ys[3] != m_) return internal_error(q.node.where(), "the stages' channels do not match X's and Y's");
    const Node dw = nn::depthwise_stage(q.node);
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(dw, {h_, w_}, {kh_, kw_}, false));
    s_ = win.strides[0], pt_ = win.pads[0], pl_ = win.pads[1];
    KILN_ASSIGN_OR_RETURN(act1_, read_activation(q.node, "pointwise_activation"));
    KILN_ASSIGN_OR_RETURN(act2_, read_activation(q.node, "activation"));
    has_b1_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
    has_b2_ = q.inputs.size() > 4 && q.inputs[4].dtype != DType::undefined;
    // The ring: the expanded rows one step of output rows reads.
    step_ = dwconv_nhwc_step(kh_, kw_, s_);
    ring_ = kh_ + (step_ - 1) * s_;
    // W1 [M, C, 1, 1] is Bᵀ of the rows' product, packed once for the tile.
    const gemm::CacheSizes& caches = gemm::CacheSizes::host();
    const gemm::Tile tile = gemm::default_tile(isa_, w_, m_, c_, caches);
    params_ = gemm::default_params(isa_, tile, caches, ring_ * w_, m_, c_, 1);
    params_.tm = params_.tn = 1;
    const Tensor plain = q.inputs[1].value->is_packed() ? unpack(*q.inputs[1].value) : *q.inputs[1].value;
    b1_packed_ = Tensor(DType::f32, {gemm::packed_b_floats(c_, m_, tile.nr)});
    gemm::pack_b(plain.data<float>(), c_, true, c_, m_, tile.nr, b1_packed_.data<float>());
    // W2 [M, 1, KH, KW] -> [KH, KW, M]
    const Tensor& f = *q.inputs[3].value;
    w2_packed_ = Tensor(DType::f32, {kh_, kw_, m_});
    pack_dwconv_nhwc_filters((f.is_packed() ? unpack(f) : f).data<float>(), m_, kh_ * kw_, w2_packed_.data<float>());
    threads_ = std::max(1, q.target.threads);
    parallel_ = n_ * (h_ * w_ * c_ * m_ + oh_ * ow_ * m_ * kh_ * kw_) >= (int64_t{1} << 16);  // as the row kernels share work
    const gemm::GemmProblem shape{.m = ring_ * w_, .n = m_, .k = c_, .b_packed = true};
    ring_bytes_ = (static_cast<size_t>(ring_ * w_ * m_) * sizeof(float) + 63) / 64 * 64;
    thread_bytes_ = ring_bytes_ + (gemm::workspace_bytes(params_, shape) + 63) / 64 * 64;
    needs.workspace_bytes = static_cast<size_t>(threads_) * thread_bytes_;
    return {};
  }

  std::vector<std::pair<std::string, KernelParam>> params() const override {
    return {{"mr", int64_t{params_.tile.mr}}, {"nr", int64_t{params_.tile.nr}}, {"ring", ring_}};
  }
  std::string label() const override { return params_.name() + "_ring" + std::to_string(ring_); }

  Status run(KernelContext& ctx) override {
    const float* x = ctx.input(0).data<float>();
    const float* b1 = has_b1_ ? ctx.input(2).data<float>() : nullptr;
    const float* b2 = has_b2_ ? ctx.input(4).data<float>() : nullptr;
    float* y = ctx.output(0).data<float>();
    std::byte* workspace = ctx.workspace().data();
    const int64_t units = (oh_ + step_ - 1) / step_, row = ow_ * m_;
    const int threads = parallel_ ? std::min(threads_, pool_threads()) : 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      WorkerSpan span;
      const int t = omp_get_thread_num();
      float* ring = reinterpret_cast<float*>(workspace + static_cast<size_t>(t) * thread_bytes_);
      std::byte* gemm_ws = workspace + static_cast<size_t>(t) * thread_bytes_ + ring_bytes_;
      std::array<const float*, kDwconvNhwcMaxRows + 2> in{};
      // The expanded rows in the ring: those of keys below have_hi (key b · H + r for image b's
      // row r) back to the last run of rows computed, at most `ring_` of them. A thread's
      // output rows run in order, so it expands each row it reads once, the first time.
      int64_t have_hi = 0;
      const auto [u0, u1] = even_share(n_ * units, omp_get_num_threads(), t);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / units, o = u % units * step_, rows = std::min(step_, oh_ - o), r0 = o * s_ - pt_;
        const int64_t i0 = std::max<int64_t>(0, -r0), i1 = std::min(kh_ + (rows - 1) * s_, h_ - r0);
        const int64_t lo = b * h_ + r0 + i0, hi = b * h_ + r0 + i1;
        if (lo > have_hi) have_hi = lo;  // a thread's first rows
        for (int64_t key = std::max(have_hi, lo); key < hi;) {  // the rows not yet expanded, in runs of ring slots
          const int64_t slot = key % ring_, run = std::min(hi - key, ring_ - slot);
          gemm::GemmProblem g{.m = run * w_, .n = m_, .k = c_, .a = x + key * w_ * c_, .lda = c_, .b = b1_packed_.data<float>(),
                              .b_packed = true, .c = ring + slot * w_ * m_, .ldc = m_};
          g.epilogue.bias = b1;
          g.epilogue.act = act1_;
          gemm::run(params_, g, gemm_ws);
          key += run;
        }
        have_hi = std::max(have_hi, hi);
        for (int64_t i = i0; i < i1; ++i) in[static_cast<size_t>(i)] = ring + ((b * h_ + r0 + i) % ring_) * w_ * m_;
        rows_.dwconv_nhwc_rows(in.data(), i0, i1, rows, w_, m_, w2_packed_.data<float>(), b2, kh_, kw_, s_, pl_,
                               y + (b * oh_ + o) * row, ow_, nullptr, act2_, {});
      }
    }
    return {};
  }

 private:
  Isa isa_;
  const RowKernels& rows_;
  gemm::GemmParams params_;
  Tensor b1_packed_, w2_packed_;
  int64_t n_ = 0, h_ = 0, w_ = 0, c_ = 0, m_ = 0, kh_ = 0, kw_ = 0, oh_ = 0, ow_ = 0, s_ = 1, pt_ = 0, pl_ = 0;
  int64_t step_ = 1, ring_ = 1;
  size_t ring_bytes_ = 0, thread_bytes_ = 0;
  int threads_ = 1;
  bool parallel_ = false, has_b1_ = false, has_b2_ = false;
  ActivationSpec act1_, act2_;
};

}  // namespace

void register_pointwise_depthwise(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("PointwiseDepthwiseConv", "cpu",
          KernelImpl{.name = std::string("kiln.pointwise_depthwise_f32_") + isa_name(isa),
                     .declines = [isa](const KernelQuery& q) { return pointwise_depthwise_declines(q, isa); },
                     .create = [isa](const KernelQuery&) { return std::make_unique<PointwiseDepthwiseKernel>(isa); },
                     .needs_isa = isa_features(isa)});
}

}  // namespace kiln::cpu
