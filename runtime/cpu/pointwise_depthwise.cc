// kiln.pointwise_depthwise_f32_<isa>: PointwiseDepthwiseConv (compile's fuse_pointwise_depthwise:
// an inverted residual block's 1x1 expansion, the depthwise convolution after it and the 1x1
// projection after that, the first or the last absent) without the intermediate tensors. Each
// thread takes output rows in order and keeps the expanded rows their filter rows read in a
// ring of KH (+ 1 for a pair of stride-1 rows) row buffers: a new output row computes only the
// expanded rows it is the first to read, kiln's GEMM over the input rows [rows · W, C] by the
// packed W1 with the pointwise epilogue, straight into their buffers, and the depthwise rows
// read them from L2 (RowKernels::dwconv_nhwc_rows); without W1 they read X's rows. With W3 the
// depthwise rows go to a buffer of the thread's, and a second GEMM projects them into Y's rows
// with the projection's epilogue (bias, activation, the residual Z's rows). MobileNetV2's
// 112x112 expansion to 96 channels wrote 4.8 MB that its depthwise convolution read back.
// f16 weights (`--precision fp16`) are widened as they are packed: every stage sums in f32.
#include <omp.h>

#include <array>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> pointwise_depthwise_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const InferInput& in = q.inputs[i];
    const bool weight = i == 1 || i == 3 || i == 5;  // f16 ones widened as they are packed
    if (in.dtype != DType::undefined && ((in.dtype != DType::f32 && !(weight && in.dtype == DType::f16)) || !in.shape.is_concrete()))
      return "not f32 of known shape";
  }
  if (!nn::channels_last(q.node)) return "not channels-last";
  if (q.inputs.size() < 4 || q.inputs[0].shape.rank() != 4) return "not a 2-D convolution";
  for (size_t i : {1, 3, 5})
    if (q.has_input(i) && !q.inputs[i].value) return "the weights are computed at run time";
  const std::vector<int64_t> w2 = q.inputs[3].shape.concrete();
  if (w2[2] > kDwconvNhwcMaxRows) return "a filter taller than " + std::to_string(kDwconvNhwcMaxRows) + " rows";
  if (auto why = dwconv_window_declines(q.node)) return why;
  if (shape_numel(q.inputs[0].shape.concrete()) == 0 || shape_numel(q.outputs[0].shape.concrete()) == 0) return "an empty tensor";
  return std::nullopt;
}

// A weight as plain f32: unpacked, an f16 one (`--precision fp16`) widened.
Tensor plain_f32(const Tensor& w) {
  if (w.dtype() == DType::f16) return gemm::widened_to_f32(w);
  return w.is_packed() ? unpack(w) : w;
}

class PointwiseDepthwiseKernel final : public Kernel {
 public:
  explicit PointwiseDepthwiseKernel(Isa isa) : isa_(isa), rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete(), w2 = q.inputs[3].shape.concrete();
    n_ = xs[0], h_ = xs[1], w_ = xs[2], c_ = xs[3], m_ = w2[0], kh_ = w2[2], kw_ = w2[3], oh_ = ys[1], ow_ = ys[2], p_ = ys[3];
    has_w1_ = q.has_input(1), has_w3_ = q.has_input(5);
    has_b1_ = q.has_input(2), has_b2_ = q.has_input(4), has_b3_ = q.has_input(6), has_z_ = q.has_input(7);
    if ((has_w1_ ? q.inputs[1].shape.concrete()[1] : m_) != c_ || (has_w3_ ? q.inputs[5].shape.concrete()[1] : p_) != m_)
      return internal_error(q.node.where(), "the stages' channels do not match X's and Y's");
    const Node dw = nn::depthwise_stage(q.node);
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(dw, {h_, w_}, {kh_, kw_}, false));
    s_ = win.strides[0], pt_ = win.pads[0], pl_ = win.pads[1];
    KILN_ASSIGN_OR_RETURN(act1_, read_activation(q.node, "pointwise_activation"));
    KILN_ASSIGN_OR_RETURN(act2_, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(act3_, read_activation(q.node, "projection_activation"));
    step_ = dwconv_nhwc_step(kh_, kw_, s_);
    const gemm::CacheSizes& caches = gemm::CacheSizes::host();
    auto aligned = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
    size_t gemm_bytes = 0;
    // A 1x1 stage's weight [N, K, 1, 1] is Bᵀ of its rows' product, packed once for the tile
    // that suits one row of `row` pixels; a call multiplies at most `rows` pixels.
    auto pointwise = [&](size_t input, int64_t row, int64_t rows, int64_t n, int64_t k, gemm::GemmParams& params, Tensor& packed) {
      const gemm::Tile tile = gemm::default_tile(isa_, row, n, k, caches);
      params = gemm::default_params(isa_, tile, caches, rows, n, k, 1);
      params.tm = params.tn = 1;
      const Tensor plain = plain_f32(*q.inputs[input].value);
      packed = Tensor(DType::f32, {gemm::packed_b_floats(k, n, tile.nr)});
      gemm::pack_b(plain.data<float>(), k, true, k, n, tile.nr, packed.data<float>());
      gemm_bytes = std::max(gemm_bytes, gemm::workspace_bytes(params, gemm::GemmProblem{.m = rows, .n = n, .k = k, .b_packed = true}));
    };
    // The ring: the expanded rows one step of output rows reads.
    ring_ = has_w1_ ? kh_ + (step_ - 1) * s_ : 0;
    if (has_w1_) pointwise(1, w_, ring_ * w_, m_, c_, params1_, w1_packed_);
    if (has_w3_) pointwise(5, ow_, step_ * ow_, p_, m_, params3_, w3_packed_);
    // W2 [M, 1, KH, KW] -> [KH, KW, M]
    w2_packed_ = Tensor(DType::f32, {kh_, kw_, m_});
    pack_dwconv_nhwc_filters(plain_f32(*q.inputs[3].value).data<float>(), m_, kh_ * kw_, w2_packed_.data<float>());
    threads_ = std::max(1, q.target.threads);
    const int64_t work = (has_w1_ ? h_ * w_ * c_ * m_ : 0) + oh_ * ow_ * m_ * (kh_ * kw_ + (has_w3_ ? p_ : 0));
    parallel_ = n_ * work >= (int64_t{1} << 16);  // as the row kernels share work
    ring_bytes_ = aligned(static_cast<size_t>(ring_ * w_ * m_) * sizeof(float));
    rows_bytes_ = has_w3_ ? aligned(static_cast<size_t>(step_ * ow_ * m_) * sizeof(float)) : 0;
    thread_bytes_ = ring_bytes_ + rows_bytes_ + aligned(gemm_bytes);
    needs.workspace_bytes = static_cast<size_t>(threads_) * thread_bytes_;
    return {};
  }

  std::vector<std::pair<std::string, KernelParam>> params() const override {
    std::vector<std::pair<std::string, KernelParam>> p;
    if (has_w1_) p.insert(p.end(), {{"mr", int64_t{params1_.tile.mr}}, {"nr", int64_t{params1_.tile.nr}}, {"ring", ring_}});
    if (has_w3_) p.insert(p.end(), {{"projection_mr", int64_t{params3_.tile.mr}}, {"projection_nr", int64_t{params3_.tile.nr}}});
    return p;
  }
  std::string label() const override {
    std::string s;
    if (has_w1_) s.append(params1_.name()).append("_ring").append(std::to_string(ring_));
    if (has_w3_) s.append(has_w1_ ? "_then_" : "then_").append(params3_.name());
    return s;
  }

  Status run(KernelContext& ctx) override {
    const float* x = ctx.input(0).data<float>();
    const float* b1 = has_b1_ ? ctx.input(2).data<float>() : nullptr;
    const float* b2 = has_b2_ ? ctx.input(4).data<float>() : nullptr;
    const float* b3 = has_b3_ ? ctx.input(6).data<float>() : nullptr;
    const float* z = has_z_ ? ctx.input(7).data<float>() : nullptr;
    float* y = ctx.output(0).data<float>();
    std::byte* workspace = ctx.workspace().data();
    const int64_t units = (oh_ + step_ - 1) / step_;
    const int threads = parallel_ ? std::min(threads_, pool_threads()) : 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      WorkerSpan span;
      const int t = omp_get_thread_num();
      std::byte* mine = workspace + static_cast<size_t>(t) * thread_bytes_;
      float* ring = reinterpret_cast<float*>(mine);
      float* depthwise_rows = reinterpret_cast<float*>(mine + ring_bytes_);
      std::byte* gemm_ws = mine + ring_bytes_ + rows_bytes_;
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
        if (!has_w1_) {
          for (int64_t i = i0; i < i1; ++i) in[static_cast<size_t>(i)] = x + (b * h_ + r0 + i) * w_ * c_;
        } else {
          if (lo > have_hi) have_hi = lo;  // a thread's first rows
          for (int64_t key = std::max(have_hi, lo); key < hi;) {  // the rows not yet expanded, in runs of ring slots
            const int64_t slot = key % ring_, run = std::min(hi - key, ring_ - slot);
            gemm::GemmProblem g{.m = run * w_, .n = m_, .k = c_, .a = x + key * w_ * c_, .lda = c_, .b = w1_packed_.data<float>(),
                                .b_packed = true, .c = ring + slot * w_ * m_, .ldc = m_};
            g.epilogue.bias = b1;
            g.epilogue.act = act1_;
            gemm::run(params1_, g, gemm_ws);
            key += run;
          }
          have_hi = std::max(have_hi, hi);
          for (int64_t i = i0; i < i1; ++i) in[static_cast<size_t>(i)] = ring + ((b * h_ + r0 + i) % ring_) * w_ * m_;
        }
        const int64_t at = (b * oh_ + o) * ow_;  // the first output pixel
        rows_.dwconv_nhwc_rows(in.data(), i0, i1, rows, w_, m_, w2_packed_.data<float>(), b2, kh_, kw_, s_, pl_,
                               has_w3_ ? depthwise_rows : y + at * m_, ow_, nullptr, act2_, {});
        if (has_w3_) {
          gemm::GemmProblem g{.m = rows * ow_, .n = p_, .k = m_, .a = depthwise_rows, .lda = m_, .b = w3_packed_.data<float>(),
                              .b_packed = true, .c = y + at * p_, .ldc = p_};
          g.epilogue = {.bias = b3, .z = z ? z + at * p_ : nullptr, .ldz = p_, .act = act3_};
          gemm::run(params3_, g, gemm_ws);
        }
      }
    }
    return {};
  }

 private:
  Isa isa_;
  const RowKernels& rows_;
  gemm::GemmParams params1_, params3_;
  Tensor w1_packed_, w2_packed_, w3_packed_;
  int64_t n_ = 0, h_ = 0, w_ = 0, c_ = 0, m_ = 0, kh_ = 0, kw_ = 0, oh_ = 0, ow_ = 0, p_ = 0, s_ = 1, pt_ = 0, pl_ = 0;
  int64_t step_ = 1, ring_ = 0;
  size_t ring_bytes_ = 0, rows_bytes_ = 0, thread_bytes_ = 0;
  int threads_ = 1;
  bool parallel_ = false, has_w1_ = false, has_w3_ = false, has_b1_ = false, has_b2_ = false, has_b3_ = false, has_z_ = false;
  ActivationSpec act1_, act2_, act3_;
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
