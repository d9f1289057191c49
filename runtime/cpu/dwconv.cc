// kiln.dwconv_f32_<isa>: depthwise 2-D convolution (Conv / FusedConv with one input and one
// output channel per group) on f32 tensors, with the fused epilogue applied per output row
// while it is in cache. Channels-first, oneDNN 2.6 runs these through im2col + GEMM, one
// channel at a time; a direct loop over zero-padded planes, vectorised along the output row,
// does far less. Channels-last, the channels are the vector lanes and the filters are packed
// [KH, KW, C] once at plan time; oneDNN's kernel there leaves a SiLU epilogue (EfficientNet's)
// to a second pass over the output, which this one applies while the row is in cache. An f16
// weight (`--precision fp16`) is widened as the filters are packed.
//
// kiln.dwconv_bf16_avx512: the channels-last one by a bf16 weight (`kiln compile --precision
// bf16`), X and Y each f32 or bf16 (bf16 activations between convolutions on an AMX target).
// Each thread widens the input rows its output rows read into a ring of f32 rows (an f32 X
// rounded to bf16 first, as the products of a bf16 weight take it), once per row, and the
// f32 row kernel above convolves them with the widened filters; a bf16 Y is computed into an
// f32 row of the thread's, the epilogue applied there, and rounded as it is stored. oneDNN's
// bf16 depthwise kernel took 1.5-1.7x the f32 one's time (EfficientNet-B0's SiLU layers), and
// with an f32 X reordered the whole of it to bf16 first. On a CPU with AVX512-BF16 the 3x3 and
// 5x5 stride-2 ones without a residual take the direct form instead (dwconv_bf16.h, label
// `direct`): X's rows read where they lie, brought to f32 in the registers, the activation
// applied and a bf16 Y rounded there; the widening, the epilogue's pass and the rounding had
// taken as long as the convolution itself.
#include <omp.h>

#include <array>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/dwconv_bf16.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> dwconv_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (auto why = x_form_decline(q)) return why;
  // An f16 weight (`--precision fp16`: a FusedConv's) is widened as the filters are packed.
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const InferInput& in = q.inputs[i];
    if (in.dtype != DType::undefined && ((in.dtype != DType::f32 && !(i == 1 && in.dtype == DType::f16)) || !in.shape.is_concrete()))
      return "not f32 of known shape";
  }
  const Shape& xs = q.inputs[0].shape;
  const Shape& ws = q.inputs[1].shape;
  if (xs.rank() != 4) return "not a 2-D convolution";
  const int64_t c = xs.dims[nn::channels_last(q.node) ? 3 : 1].value, group = q.node.attr_int("group", 1);
  if (group != c || ws.dims[0].value != c || ws.dims[1].value != 1) return "not depthwise (one channel per group in and out)";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  if (nn::channels_last(q.node) && ws.dims[2].value > kDwconvNhwcMaxRows)
    return "channels-last with a filter taller than " + std::to_string(kDwconvNhwcMaxRows) + " rows";
  if (auto why = dwconv_window_declines(q.node)) return why;
  if (shape_numel(xs.concrete()) == 0) return "an empty input";
  return std::nullopt;
}

// Whether a FusedConv's epilogue is a ReLU or Clip alone (no residual, no second activation),
// which kiln's channels-last row kernels apply in the registers (RowKernels::dwconv_nhwc_rows).
bool clamps_alone(const KernelQuery& q) {
  const Result<ActivationSpec> act = read_activation(q.node, "activation"), post = read_activation(q.node, "post_activation");
  return act.ok() && post.ok() && (act->kind == Activation::relu || act->kind == Activation::clip) &&
         post->kind == Activation::none && !q.has_input(3);
}

// The default rule's share of the channels-last ones: kiln takes the 3x3 and 5x5 ones (stride 1
// or 2) whose epilogue is transcendental (SiLU, where oneDNN's post-ops lack it and a second
// pass over the output applies it; kiln's applies it to the sums in the registers), and the
// stride-1 ones whose epilogue is a ReLU or Clip alone (also in the registers; MobileNetV2's
// stride-1 layers 0.90 of their time on kiln's at one thread, 0.96 at two), where their output
// rows have at least as many columns with every tap inside the image as with taps in the
// padding. oneDNN keeps the rest: the other piecewise-linear epilogues and none, stride 2 with
// a ReLU or Clip (MobileNetV2's two: 1.03-1.30x their time on kiln's), 7x7 filters, and rows
// mostly edge (5x5 stride 1 on 7 columns: 0.91-1.10x). In the compiled models, alternated
// profiles per node at one and two threads; docs/architecture.md has the table. max-autotune
// times both.
std::optional<std::string> dwconv_defers(const KernelQuery& q) {
  if (!nn::channels_last(q.node)) return std::nullopt;
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete();
  const int64_t k = ws[2];
  if ((k != 3 && k != 5) || ws[3] != k) return "oneDNN's channels-last depthwise kernel is as fast but on 3x3 and 5x5 filters";
  const Result<nn::Window> w = nn::resolve_window(q.node, {xs[1], xs[2]}, {k, k}, false);
  if (!w.ok()) return "an invalid window";
  const int64_t ow = w->out[1];
  const auto [j0, j1] = dwconv_inside_columns(xs[2], k, w->strides[1], w->pads[1], ow);
  if (2 * (j1 - j0) < ow) return "oneDNN's channels-last depthwise kernel is as fast on rows mostly of edge columns";
  if (piecewise_linear_activation(q.node) && !(w->strides[1] == 1 && clamps_alone(q)))
    return w->strides[1] == 1 ? "oneDNN's channels-last depthwise kernel applies a piecewise-linear epilogue faster"
                              : "oneDNN's channels-last depthwise kernel is faster at stride 2 with a piecewise-linear epilogue";
  return std::nullopt;
}

class DwConvKernel final : public Kernel {
 public:
  explicit DwConvKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    last_ = nn::channels_last(q.node);
    std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
    const std::vector<int64_t> ws = q.inputs[1].shape.concrete();
    if (last_) {  // the logical [N, C, H, W] of the stored [N, H, W, C]
      xs = {xs[0], xs[3], xs[1], xs[2]};
      ys = {ys[0], ys[3], ys[1], ys[2]};
    }
    KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, {xs[2], xs[3]}, {ws[2], ws[3]}, false));
    n_ = xs[0], c_ = xs[1], h_ = xs[2], w_ = xs[3], kh_ = ws[2], kw_ = ws[3];
    s_ = w.strides[0], pt_ = w.pads[0], pl_ = w.pads[1], oh_ = ys[2], ow_ = ys[3];
    const Tensor& weight = *q.inputs[1].value;
    weights_ = weight.dtype() == DType::f16 ? gemm::widened_to_f32(weight) : weight;
    if (last_) {  // [C, 1, KH, KW] -> [KH, KW, C]
      Tensor packed(DType::f32, {kh_, kw_, c_});
      pack_dwconv_nhwc_filters(weights_.data<float>(), c_, kh_ * kw_, packed.data<float>());
      weights_ = std::move(packed);
    }
    has_bias_input_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
    if (q.node.op == "FusedConv") {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
      has_z_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    }
    if (!last_)
      needs.workspace_bytes = static_cast<size_t>(std::max(1, q.target.threads)) *
                              static_cast<size_t>(dwconv_scratch_floats(kh_, kw_, s_, oh_, ow_)) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* bias = has_bias_input_ ? ctx.input(2).data<float>() : nullptr;
    const float* z = has_z_ ? ctx.input(3).data<float>() : nullptr;
    if (last_)
      rows_.dwconv_nhwc(ctx.input(0).data<float>(), n_, h_, w_, c_, weights_.data<float>(), bias, kh_, kw_, s_, pt_, pl_,
                        ctx.output(0).data<float>(), oh_, ow_, z, act_, post_);
    else
      rows_.dwconv(ctx.input(0).data<float>(), n_ * c_, c_, h_, w_, weights_.data<float>(), bias, kh_, kw_, s_, pt_, pl_,
                   ctx.output(0).data<float>(), oh_, ow_, z, act_, post_, reinterpret_cast<float*>(ctx.workspace().data()));
    return {};
  }

 private:
  const RowKernels& rows_;
  Tensor weights_;  // [C, 1, KH, KW] as given, or [KH, KW, C] channels-last
  int64_t n_ = 0, c_ = 0, h_ = 0, w_ = 0, kh_ = 0, kw_ = 0, s_ = 1, pt_ = 0, pl_ = 0, oh_ = 0, ow_ = 0;
  bool last_ = false, has_bias_input_ = false, has_z_ = false;
  ActivationSpec act_, post_;
};

// Values of output from which a depthwise convolution's rows are shared among the threads (as
// RowKernels::dwconv_nhwc shares them).
constexpr int64_t kParallelValues = 1 << 16;

std::optional<std::string> dwconv_bf16_declines(const KernelQuery& q) {
  if (auto why = lacks(q.target.cpu, Isa::avx512)) return why;
  if (auto why = x_form_decline(q)) return why;
  if (q.node.op != "FusedConv" || !nn::channels_last(q.node)) return "not a channels-last FusedConv";
  if (q.inputs[1].dtype != DType::bf16 || !q.inputs[1].value) return "not by a constant bf16 weight";
  const DType x = q.inputs[0].dtype, y = q.outputs[0].dtype;
  if ((x != DType::f32 && x != DType::bf16) || (y != DType::f32 && y != DType::bf16)) return "X or Y neither f32 nor bf16";
  if (q.has_input(2) && q.inputs[2].dtype != DType::f32) return "the bias is not f32";
  if (q.has_input(3) && q.inputs[3].dtype != y) return "Z's type is not Y's";
  for (const Shape* s : {&q.inputs[0].shape, &q.inputs[1].shape, &q.outputs[0].shape})
    if (!s->is_concrete() || shape_numel(s->concrete()) == 0) return "a shape is not known ahead or is empty";
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete();
  if (xs.size() != 4) return "not a 2-D convolution";
  if (q.node.attr_int("group", 1) != xs[3] || ws[0] != xs[3] || ws[1] != 1) return "not depthwise (one channel per group in and out)";
  if (ws[2] > kDwconvNhwcMaxRows) return "a filter taller than " + std::to_string(kDwconvNhwcMaxRows) + " rows";
  if (auto why = dwconv_window_declines(q.node)) return why;
  return std::nullopt;
}

// Whether a node takes the direct form (dwconv_bf16.h) where the CPU has AVX512-BF16: 3x3, or
// 5x5 stride 2, no residual, channels a multiple of 16, an activation it applies on its
// registers. A 5x5 stride-1 layer keeps the widened ring: each input column its row loads feeds
// few products on narrow rows (EfficientNet-B0's 14x14 and 7x7 ones: 1.06-1.29x the ring's time
// direct), and the widening in the registers is two more instructions a load.
bool direct_form(const KernelQuery& q) {
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete();
  const int64_t k = ws[2], s = q.node.attr_ints("strides", {1, 1})[0];
  if (q.has_input(3) || ws[3] != k || !(k == 3 || (k == 5 && s == 2)) || xs[3] % dwbf16::kLanes != 0) return false;
  const Result<ActivationSpec> act = read_activation(q.node, "activation"), post = read_activation(q.node, "post_activation");
  return act.ok() && post.ok() && post->kind == Activation::none && dwbf16::takes_activation(*act);
}

// The default rule's share: where the target has AVX512-BF16, every layer the direct form
// takes (MobileNetV2's Clip layers: 0.69-0.89 of oneDNN's bf16 kernel's time at one thread,
// 0.60-0.93 at two; EfficientNet-B0's 3x3 stride-2 ones 0.63-0.66; medians of 6 and 4
// alternated profiles a node of the bf16 compiles). Otherwise 3x3 and 5x5 filters with a
// transcendental epilogue, but the 3x3 stride-2 ones: on the widened ring, 0.59-0.90 of
// oneDNN's time on the stride-1 SiLU layers (5x5 on 7 columns included, unlike f32's rule) and
// 0.89-0.97 on the 5x5 stride-2 ones; 1.04-1.12 on the 3x3 stride-2 ones, whose widened input
// rows are four times the output; with a Clip, 1.06-1.22 (0.88 on 32 channels).
std::optional<std::string> dwconv_bf16_defers(const KernelQuery& q) {
  if (q.target.cpu.avx512_bf16 && direct_form(q)) return std::nullopt;
  const int64_t k = q.inputs[1].shape.dims[2].value;
  if ((k != 3 && k != 5) || q.inputs[1].shape.dims[3].value != k) return "oneDNN's bf16 depthwise kernel is as fast but on 3x3 and 5x5 filters";
  if (piecewise_linear_activation(q.node)) return "oneDNN's bf16 depthwise kernel applies a piecewise-linear epilogue faster";
  if (k == 3 && q.node.attr_ints("strides", {1, 1})[0] == 2)
    return "oneDNN's bf16 depthwise kernel is as fast on 3x3 stride-2 filters (kiln widens two input rows an output row)";
  return std::nullopt;
}

class DwConvBf16Kernel final : public Kernel {
 public:
  DwConvBf16Kernel() : rows_(row_kernels(Isa::avx512)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete();
    n_ = xs[0], h_ = xs[1], w_ = xs[2], c_ = xs[3], kh_ = ws[2], kw_ = ws[3], oh_ = ys[1], ow_ = ys[2];
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(q.node, {h_, w_}, {kh_, kw_}, false));
    s_ = win.strides[0], pt_ = win.pads[0], pl_ = win.pads[1];
    x_bf16_ = q.inputs[0].dtype == DType::bf16, y_bf16_ = q.outputs[0].dtype == DType::bf16;
    has_bias_ = q.has_input(2), has_z_ = q.has_input(3);
    KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
    // The weight widened (exact) and packed [KH, KW, C].
    const int64_t taps = kh_ * kw_;
    Tensor wide(DType::f32, {c_, taps});
    rows_.widen_bf16(static_cast<const uint16_t*>(q.inputs[1].value->raw()), wide.data<float>(), c_ * taps);
    filters_ = Tensor(DType::f32, {kh_, kw_, c_});
    pack_dwconv_nhwc_filters(wide.data<float>(), c_, taps, filters_.data<float>());
    threads_ = std::max(1, q.target.threads);
    parallel_ = threads_ > 1 && n_ * oh_ * ow_ * c_ * kh_ * kw_ >= kParallelValues;
    direct_ = direct_form(q) && CpuFeatures::host().avx512_bf16;
    if (direct_) {  // no workspace
      direct_params_ = dwbf16::Params{.h = h_, .w = w_, .c = c_, .k = kh_, .s = s_, .pt = pt_, .pl = pl_, .oh = oh_, .ow = ow_,
                                      .x_bf16 = x_bf16_, .y_bf16 = y_bf16_, .filters = filters_.data<float>(), .act = act_};
      return {};
    }
    // A thread's ring holds the input rows of one step of output rows: each row lands in slot
    // row % ring_, and the next step's rows that this one read stay where they are.
    step_ = dwconv_nhwc_step(kh_, kw_, s_);
    ring_ = kh_ + (step_ - 1) * s_;
    const int64_t out_rows = step_ * ow_ * c_;
    thread_floats_ = ring_ * w_ * c_ + (y_bf16_ ? out_rows : 0) + (y_bf16_ && has_z_ ? out_rows : 0);
    needs.workspace_bytes = static_cast<size_t>(parallel_ ? threads_ : 1) * static_cast<size_t>(thread_floats_) * sizeof(float);
    return {};
  }

  Status run(KernelContext& ctx) override {
    if (direct_) return run_direct(ctx);
    const std::byte* x = static_cast<const std::byte*>(ctx.input(0).raw());
    const float* bias = has_bias_ ? ctx.input(2).data<float>() : nullptr;
    const std::byte* z = has_z_ ? static_cast<const std::byte*>(ctx.input(3).raw()) : nullptr;
    std::byte* y = static_cast<std::byte*>(ctx.output(0).raw());
    float* workspace = reinterpret_cast<float*>(ctx.workspace().data());
    const int64_t units = (oh_ + step_ - 1) / step_, row_in = w_ * c_, row_out = ow_ * c_;
    const size_t xe = x_bf16_ ? 2 : 4, ye = y_bf16_ ? 2 : 4;  // element bytes
    const int threads = parallel_ ? std::min(threads_, pool_threads()) : 1;
    ShareQueues queues(threads, ShareQueues::chunk_for(n_ * units, threads));
    queues.fill(n_ * units);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      WorkerSpan span;
      float* ring = workspace + static_cast<int64_t>(thread_index()) * thread_floats_;
      float* out_f32 = ring + ring_ * row_in;  // a bf16 Y's rows before they are rounded
      float* z_f32 = out_f32 + step_ * row_out;  // and a bf16 Z's, widened
      std::array<int64_t, kDwconvNhwcMaxRows + 1> held;  // the input row (b · H + r) in each slot
      held.fill(-1);
      std::array<const float*, kDwconvNhwcMaxRows + 1> in{};
      queues.drain(thread_index(), [&](int64_t u0, int64_t u1, bool) {
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t b = u / units, o = u % units * step_, rows = std::min(step_, oh_ - o), r0 = o * s_ - pt_;
          const int64_t i0 = std::max<int64_t>(0, -r0), i1 = std::min(kh_ + (rows - 1) * s_, h_ - r0);
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t key = b * h_ + r0 + i, slot = key % ring_;
            float* dst = ring + slot * row_in;
            if (held[static_cast<size_t>(slot)] != key) {
              const std::byte* src = x + static_cast<size_t>(key * row_in) * xe;
              if (x_bf16_) rows_.widen_bf16(reinterpret_cast<const uint16_t*>(src), dst, row_in);
              else rows_.round_bf16(reinterpret_cast<const float*>(src), dst, row_in);
              held[static_cast<size_t>(slot)] = key;
            }
            in[static_cast<size_t>(i)] = dst;
          }
          const int64_t at = (b * oh_ + o) * row_out, count = rows * row_out;  // the first output value, and how many
          const float* zr = nullptr;
          if (z && y_bf16_) {
            rows_.widen_bf16(reinterpret_cast<const uint16_t*>(z) + at, z_f32, count);
            zr = z_f32;
          } else if (z) {
            zr = reinterpret_cast<const float*>(z) + at;
          }
          float* out = y_bf16_ ? out_f32 : reinterpret_cast<float*>(y) + at;
          rows_.dwconv_nhwc_rows(in.data(), i0, i1, rows, w_, c_, filters_.data<float>(), bias, kh_, kw_, s_, pl_, out, ow_, zr, act_,
                                 post_);
          if (y_bf16_) rows_.narrow_bf16(out_f32, reinterpret_cast<uint16_t*>(y + static_cast<size_t>(at) * ye), count);
        }
      });
    }
    return {};
  }

  std::string label() const override { return direct_ ? "direct" : ""; }

 private:
  // The direct form (dwconv_bf16.h): the image's output rows shared among the threads in
  // chunks, each row from X's rows where they lie straight into Y's.
  Status run_direct(KernelContext& ctx) {
    const auto* x = static_cast<const std::byte*>(ctx.input(0).raw());
    const size_t xe = x_bf16_ ? 2 : 4;
    const float* bias = has_bias_ ? ctx.input(2).data<float>() : nullptr;
    auto* y = static_cast<std::byte*>(ctx.output(0).raw());
    const size_t ye = y_bf16_ ? 2 : 4;
    const int threads = parallel_ ? std::min(threads_, pool_threads()) : 1;
    ShareQueues queues(threads, ShareQueues::chunk_for(n_ * oh_, threads));
    queues.fill(n_ * oh_);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      WorkerSpan span;
      queues.drain(thread_index(), [&](int64_t u0, int64_t u1, bool) {
        for (int64_t u = u0; u < u1;) {  // the rows of one image at a time
          const int64_t b = u / oh_, o1 = std::min(u1, (b + 1) * oh_);
          dwbf16::rows(direct_params_, x + static_cast<size_t>(b * h_ * w_ * c_) * xe, bias, y + static_cast<size_t>(b * oh_ * ow_ * c_) * ye,
                       u - b * oh_, o1 - b * oh_);
          u = o1;
        }
      });
    }
    return {};
  }

  const RowKernels& rows_;
  bool direct_ = false;  // the direct form (direct_form, on a CPU with AVX512-BF16)
  dwbf16::Params direct_params_;
  Tensor filters_;  // [KH, KW, C] f32
  int64_t n_ = 0, h_ = 0, w_ = 0, c_ = 0, kh_ = 0, kw_ = 0, s_ = 1, pt_ = 0, pl_ = 0, oh_ = 0, ow_ = 0;
  int64_t step_ = 1, ring_ = 0, thread_floats_ = 0;
  int threads_ = 1;
  bool parallel_ = false, x_bf16_ = false, y_bf16_ = false, has_bias_ = false, has_z_ = false;
  ActivationSpec act_, post_;
};

}  // namespace

void register_dwconv(KernelRegistry& r) {
  r.add("FusedConv", "cpu",
        KernelImpl{.name = "kiln.dwconv_bf16_avx512",
                   .declines = dwconv_bf16_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<DwConvBf16Kernel>(); },
                   .needs_isa = isa_features(Isa::avx512),
                   .defers = dwconv_bf16_defers});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"Conv", "FusedConv"})
      r.add(op, "cpu",
            KernelImpl{.name = std::string("kiln.dwconv_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return dwconv_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<DwConvKernel>(isa); },
                       .needs_isa = isa_features(isa),
                       .defers = dwconv_defers});
}

}  // namespace kiln::cpu
