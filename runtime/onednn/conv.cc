// onednn.conv: Conv and FusedConv (1-D to 3-D, grouped and depthwise) as a oneDNN forward
// convolution. The weights must be constant: prepare reorders them once into the blocked
// layout oneDNN picks for the shapes and ISA (or uses them in place when a compiled model
// stored them packed that way). A channels_last FusedConv (what `kiln compile`
// makes of the convolutions it can) runs directly on its NHWC tensors, oneDNN's fastest
// layout here (its brgemm kernels, depthwise included), with the epilogue as post-ops.
// Channels-first convolutions: ungrouped ones run on the layout oneDNN picks, reordered in and
// out through the kernel's workspace, with the epilogue as post-ops: that costs less than
// oneDNN's GEMM-based path on plain tensors, whose post-ops run element by element. Grouped
// and depthwise ones stay plain (oneDNN 2.6's blocked ones miscompute some with channel
// tails) and kiln's vectorised epilogue follows them.
//
// 3x3, stride-1, undilated, ungrouped 2-D convolutions of at least 16 channels in and out run
// as oneDNN's Winograd convolution (F(2x2, 3x3) or F(4x4, 3x3), its choice) where the CPU has
// it (AVX-512): 2.25 to 4 times fewer multiplies, within about 1e-6 of the direct result per
// convolution; it wants blocked activations, so NHWC ones are reordered in and out through the
// workspace (microseconds next to the convolution). `kiln_bench_conv` measured it against the
// direct convolution on the models' shapes. The choice is the kernel's parameter `algorithm`
// ("winograd" or "direct"), which a compiled model records.
//
// Where oneDNN offers only its reference implementation for the post-ops (on AVX2 its JIT
// kernels lack the residual's sum after a SiLU: YOLO's bottlenecks),
// the bare JIT convolution runs and kiln's epilogue follows ("kiln epilogue" in profiles).
//
// A FusedConv whose weights `kiln compile --precision bf16` stored as bf16 runs as oneDNN's bf16
// convolution (direct: oneDNN 2.6 has no bf16 Winograd): X reordered to bf16 in the workspace,
// products summed in f32, Y and the epilogue f32; the weights stored packed in bf16. Where the
// compile kept the activations bf16 (an AMX target), X, or Y and Z (`output_type` bf16), are
// bf16 NHWC tensors that the convolution reads and writes as they are, the epilogue computed in
// f32 before Y is rounded. f16 weights
// (`--precision fp16`) are widened to f32 as they are packed and convolved in f32.
//
// A pointwise convolution from bf16 activations to bf16 ones with a transcendental activation
// (EfficientNet-B0's SiLU expansions under --precision bf16) runs in chunks of pixels instead
// (`chunked_`): each thread has oneDNN convolve a chunk into f32 rows of its own, bare, then
// kiln's row kernels apply the epilogue and round the rows into Y. oneDNN 2.6's AMX
// convolution applies a SiLU post-op at about 0.7 ns an output value, several times the
// convolution's own time (the 112x112 expansion to 96 channels: 917 µs, against 242 for the
// same shape with a Clip); kiln's SiLU takes about 0.25.
#include <omp.h>

#include <optional>
#include <unordered_map>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/rows.h"
#include "runtime/onednn/onednn.h"
#include "runtime/threads.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

// Channels from which a 3x3 convolution goes to Winograd (kiln_bench_conv: it wins from 32; at
// 16, YOLO's 80x80 C2f ones, it took 0.505 against the direct algorithm's 0.304 ms on a Xeon
// with AVX512-FP16, and gained 8 % on a Zen 4: 0.12 against 0.13).
constexpr int64_t kWinogradChannels = 32;

// bf16 activations (X, or Y and Z; `kiln compile --precision bf16` on an AMX target): a
// channels-last FusedConv by a constant bf16 weight, the bias f32, Z of Y's type.
std::optional<std::string> bf16_activations_decline(const KernelQuery& q) {
  if (q.node.op != "FusedConv" || !nn::channels_last(q.node)) return "bf16 activations: only a channels-last FusedConv";
  if (q.inputs[1].dtype != DType::bf16 || !q.inputs[1].value) return "bf16 activations need a constant bf16 weight";
  if (q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined && q.inputs[2].dtype != DType::f32) return "the bias is not f32";
  const DType y = q.outputs[0].dtype;
  if (y != DType::f32 && y != DType::bf16) return "Y is neither f32 nor bf16";
  if (q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined && q.inputs[3].dtype != y) return "Z's type is not Y's";
  for (const Shape* s : {&q.inputs[0].shape, &q.outputs[0].shape})
    if (!s->is_concrete() || shape_numel(s->concrete()) == 0) return "a shape is not known ahead or is empty";
  return std::nullopt;
}

std::optional<std::string> conv_declines(const KernelQuery& q) {
  if (auto why = x_form_decline(q)) return why;
  if (q.inputs[0].dtype == DType::bf16 || q.outputs[0].dtype == DType::bf16) {
    if (auto why = bf16_activations_decline(q)) return why;
  } else if (auto why = f32_and_concrete(q, q.node.op == "FusedConv" ? DType::bf16 | DType::f16 : TypeSet())) {
    return why;
  }
  const int64_t rank = q.inputs[0].shape.rank();
  if (rank < 3 || rank > 5) return "only 1-D to 3-D convolutions";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  return std::nullopt;
}

// Whether oneDNN's Winograd convolution suits the node: 2-D, 3x3, stride 1, undilated,
// ungrouped, at least kWinogradChannels in and out, and not of int8 codes dequantized (whose
// exact products its transforms would round).
bool winograd_shape(const ConvGeometry& geo, const Node& node) {
  return !nn::int8_operands(node) && geo.kernel == std::vector<int64_t>{3, 3} && geo.group == 1 && geo.strides == memory::dims{1, 1} &&
         geo.dilations == memory::dims{0, 0} && geo.xs[1] >= kWinogradChannels && geo.ys[1] >= kWinogradChannels;
}

// max-autotune's axis: the direct and the Winograd algorithm where both can run.
std::vector<TuningAxis> conv_space(const KernelQuery& q) {
  Result<ConvGeometry> geo = conv_geometry(q, 1);
  if (!geo.ok() || !winograd_shape(*geo, q.node) || !q.target.cpu.avx512f || q.inputs[1].dtype == DType::bf16) return {};
  return {TuningAxis{"algorithm", {{{"algorithm", std::string("direct")}}, {{"algorithm", std::string("winograd")}}}}};
}

// f32 rows of C a chunk of a chunked convolution fills at most (a thread's, in L2 with its A).
constexpr int64_t kChunkBytes = 256 << 10;
// The fewest pixels a chunk takes: fewer, and oneDNN's call costs more than the chunk.
constexpr int64_t kChunkPixels = 64;
// Values of a chunk's rows the epilogue and the rounding take at a time, in L1.
constexpr int64_t kEpilogueBlock = 4096;

// The pixels of each chunk a convolution runs in (see the top): a divisor of the pixels, at
// least kChunkPixels, at least one chunk a thread, each chunk's f32 rows within kChunkBytes
// where a divisor allows; 0 where the convolution is not such a one or no divisor fits.
int64_t chunk_pixels(const KernelQuery& q, const ConvGeometry& geo) {
  if (q.node.op != "FusedConv" || !nn::channels_last(q.node) || q.has_input(3)) return 0;
  if (q.inputs[0].dtype != DType::bf16 || q.outputs[0].dtype != DType::bf16 || q.inputs[1].dtype != DType::bf16) return 0;
  if (!q.target.cpu.avx512_bf16 || !CpuFeatures::host().avx512_bf16 || geo.group != 1 || geo.kernel != std::vector<int64_t>{1, 1}) return 0;
  for (const memory::dims* d : {&geo.strides, &geo.dilations, &geo.pad_l, &geo.pad_r})
    for (int64_t v : *d)
      if (v != (d == &geo.strides ? 1 : 0)) return 0;
  if (piecewise_linear_activation(q.node)) return 0;
  const int64_t pixels = geo.ys[0] * geo.ys[2] * geo.ys[3], channels = geo.ys[1], share = pixels / std::max(1, q.target.threads);
  int64_t best = 0;  // the largest divisor within kChunkBytes, else the smallest past it
  for (int64_t d = kChunkPixels; d <= share; ++d)
    if (pixels % d == 0 && (best == 0 || d * channels * 4 <= kChunkBytes)) best = d;
  return best;
}

class ConvKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    return guarded(q.node, [&]() -> Status {
      chunked_ = false;
      KILN_ASSIGN_OR_RETURN(const ConvGeometry whole, conv_geometry(q, 1));
      if (const int64_t d = chunk_pixels(q, whole)) return prepare_chunked(q, whole, d, needs);
      // oneDNN's dims are logical [N, C, spatial...] whatever the layout.
      const bool last = nn::channels_last(q.node);
      const ConvGeometry& geo = whole;
      const std::vector<int64_t>&xs = geo.xs, &ys = geo.ys, &wdims = geo.wdims;
      const int64_t group = geo.group;
      const memory::dims &strides = geo.strides, &dil = geo.dilations, &pad_l = geo.pad_l, &pad_r = geo.pad_r;
      // Activations in bf16 (X; Y and Z) or f32.
      const bool bf16_x = q.inputs[0].dtype == DType::bf16;
      const memory::data_type xt = bf16_x ? memory::data_type::bf16 : memory::data_type::f32;
      const memory::data_type yt = q.outputs[0].dtype == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
      const memory::desc src = last ? channels_last(xs, xt) : plain(xs, xt), dst = last ? channels_last(ys, yt) : plain(ys, yt);
      // A bf16 weight (`--precision bf16`): bf16 products summed in f32 (X reordered to bf16
      // in the workspace, Y f32). An f16 one: widened to f32 once, the convolution f32.
      const Tensor& given = *q.inputs[1].value;
      const bool bf16 = given.dtype() == DType::bf16;
      const Tensor wt = given.dtype() == DType::f16 ? cpu::gemm::widened_to_f32(given) : given;
      const memory::data_type wtype = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
      const memory::desc user_w = plain(wdims, wtype);
      const memory::desc any_w(memory::dims(wdims.begin(), wdims.end()), wtype, memory::format_tag::any);
      has_bias_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
      const memory::desc bias = has_bias_ ? plain({ys[1]}) : memory::desc();
      const bool fused = q.node.op == "FusedConv";
      const bool has_z = fused && q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
      dnnl::primitive_attr attr, bare;  // with the epilogue as post-ops, and without any
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      bare.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      blocked_ = group == 1 && !last;
      const std::optional<cpu::Isa> isa = cpu::best_isa(q.target.cpu);
      auto own_epilogue = [&]() -> Status {  // kiln's row kernels apply the epilogue after oneDNN
        KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
        KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
        own_epilogue_ = &cpu::row_kernels(*isa);
        has_z_ = has_z;
        z_index_ = -1;
        return {};
      };
      const bool post_ops = fused && (blocked_ || last || !isa);
      if (post_ops) {
        KILN_ASSIGN_OR_RETURN(dnnl::post_ops ops, epilogue_post_ops(q.node, has_z ? &dst : nullptr, z_index_));
        attr.set_post_ops(ops);
      } else if (fused) {
        KILN_RETURN_IF_ERROR(own_epilogue());
      }
      // Activations in the layout oneDNN's direct convolutions want (blocked channels on
      // AVX-512: their post-ops are vectorised, the GEMM-based path on plain NCHW runs them
      // element by element), reordered from and to kiln's plain tensors in the workspace.
      auto any = [](const std::vector<int64_t>& d, memory::data_type type = memory::data_type::f32) {
        return memory::desc(memory::dims(d.begin(), d.end()), type, memory::format_tag::any);
      };
      auto primitive = [&](dnnl::algorithm alg, bool any_activations, const dnnl::primitive_attr& a) {
        const memory::desc x = bf16_x ? src : bf16 ? any(xs, wtype) : any_activations ? any(xs) : src;
        dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, alg, x, any_w, bias,
                                             any_activations ? any(ys) : dst, strides, dil, pad_l, pad_r);
        return dnnl::convolution_forward::primitive_desc(desc, a, cpu_engine());
      };
      // Winograd where the shape suits it and oneDNN has it for this CPU, unless the model
      // recorded the direct algorithm; the direct one otherwise.
      const bool wino_shape = winograd_shape(geo, q.node) && !bf16;
      const std::string* recorded = q.node.kernel.param<std::string>("algorithm");
      const bool recorded_direct = recorded && *recorded == "direct";
      winograd_ = false;
      foreign_ = false;
      lacked_post_ops_ = false;
      dnnl::convolution_forward::primitive_desc pd;
      if (wino_shape && !recorded_direct && q.target.cpu.avx512f) {
        try {
          pd = primitive(dnnl::algorithm::convolution_winograd, true, attr);
          winograd_ = true;
        } catch (const dnnl::error&) {
        }
        if (!winograd_ && post_ops && isa) {  // post-ops Winograd lacks (Swish): kiln's epilogue after it
          try {
            pd = primitive(dnnl::algorithm::convolution_winograd, true, bare);
            winograd_ = true;
            KILN_RETURN_IF_ERROR(own_epilogue());
          } catch (const dnnl::error&) {
          }
        }
      }
      if (!winograd_) {
        // None for a bf16 convolution compiled for --target avx512-bf16 on a CPU without it.
        auto direct = primitive_for(q.target, [&] { return primitive(dnnl::algorithm::convolution_direct, blocked_, attr); });
        if (!direct) {
          foreign_ = true;
          packed_ = Tensor();
          return {};
        }
        pd = *direct;
        // oneDNN's reference convolution where its JIT kernels lack the post-ops (on AVX2, a
        // channels-last 3x3 with SiLU and a residual sum: YOLO's 80x80 bottleneck, 144 ms on the
        // reference, 0.47 ms so; one-thread profiles on a Zen 3): the bare convolution, then
        // kiln's epilogue.
        if (post_ops && isa && std::string_view(pd.impl_info_str()).starts_with("ref")) {
          auto bare_pd = primitive_for(q.target, [&] { return primitive(dnnl::algorithm::convolution_direct, blocked_, bare); });
          if (bare_pd && !std::string_view(bare_pd->impl_info_str()).starts_with("ref")) {
            pd = *bare_pd;
            KILN_RETURN_IF_ERROR(own_epilogue());
            lacked_post_ops_ = true;
          }
        }
      }
      // Winograd's weight layout is its own: it starts from the plain weights. An f16 weight is
      // stored as it is (half the bytes); the others as oneDNN packed them (and shared by the
      // session's plans).
      if (winograd_ || given.dtype() == DType::f16) {
        KILN_ASSIGN_OR_RETURN(weights_, prepack(winograd_ && wt.is_packed() ? unpack(wt) : wt, user_w, pd.weights_desc()));
        packed_ = given.dtype() == DType::f16 ? Tensor() : packed_weights(given, weights_, false, "convolution");
      } else {
        KILN_ASSIGN_OR_RETURN(PrepackedWeights w, prepack_weights(q, given, user_w, pd.weights_desc(), false, "convolution"));
        weights_ = std::move(w.weights);
        packed_ = std::move(w.packed);
      }
      prim_ = dnnl::convolution_forward(pd);
      src_ = memory(src, cpu_engine(), nullptr);
      dst_ = memory(dst, cpu_engine(), nullptr);
      if (has_bias_) bias_ = memory(bias, cpu_engine(), nullptr);
      auto up = [](size_t b) { return (b + 63) / 64 * 64; };
      size_t offset = up(pd.scratchpad_desc().get_size());
      scratch_ = memory(pd.scratchpad_desc(), cpu_engine(), nullptr);
      src_offset_.reset();
      dst_offset_.reset();
      if (pd.src_desc() != src) {
        src_in_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src, cpu_engine(), pd.src_desc()));
        blocked_src_ = memory(pd.src_desc(), cpu_engine(), nullptr);
        src_offset_ = offset;
        offset += up(pd.src_desc().get_size());
      }
      if (pd.dst_desc() != dst) {
        dst_in_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), dst, cpu_engine(), pd.dst_desc()));
        dst_out_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), pd.dst_desc(), cpu_engine(), dst));
        blocked_dst_ = memory(pd.dst_desc(), cpu_engine(), nullptr);
        z_plain_ = memory(dst, cpu_engine(), nullptr);
        dst_offset_ = offset;
        offset += up(pd.dst_desc().get_size());
      }
      needs.workspace_bytes = offset;
      return {};
    });
  }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      if (foreign_) return unprepared(ctx);
      if (chunked_) return run_chunked(ctx);
      src_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      dst_.set_data_handle(ctx.output(0).raw());
      std::span<std::byte> ws = ctx.workspace();
      memory src = src_, dst = dst_;
      if (src_offset_) {
        blocked_src_.set_data_handle(ws.data() + *src_offset_);
        src_in_.execute(cpu_stream(), src_, blocked_src_);
        src = blocked_src_;
      }
      if (dst_offset_) {
        blocked_dst_.set_data_handle(ws.data() + *dst_offset_);
        dst = blocked_dst_;
      }
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst}};
      if (has_bias_) {
        bias_.set_data_handle(const_cast<void*>(ctx.input(2).raw()));
        args.emplace(DNNL_ARG_BIAS, bias_);
      }
      if (z_index_ >= 0) {
        // The residual, added by the sum post-op: Z goes into the destination first.
        const Tensor& z = ctx.input(3);
        if (dst_offset_) {
          z_plain_.set_data_handle(const_cast<void*>(z.raw()));
          dst_in_.execute(cpu_stream(), z_plain_, blocked_dst_);
        } else if (ctx.output(0).raw() != z.raw()) {  // the plan may have put Y over Z (overwrites_input)
          parallel_copy(ctx.output(0).raw(), z.raw(), z.nbytes());
        }
      }
      execute(prim_, args, scratch_, ws);
      if (dst_offset_) {
        dst_out_.execute(cpu_stream(), blocked_dst_, dst_);
        cpu_stream().wait();
      }
      if (own_epilogue_) {
        Tensor& y = ctx.output(0);
        own_epilogue_->epilogue(y.data<float>(), has_z_ ? ctx.input(3).data<float>() : nullptr, y.numel(), act_, post_);
      }
      return {};
    });
  }

  Tensor packed_input(size_t input) const override { return input == 1 ? packed_ : Tensor(); }
  std::vector<std::pair<std::string, KernelParam>> params() const override {
    return {{"algorithm", std::string(winograd_ ? "winograd" : "direct")}};
  }
  std::string label() const override {
    return winograd_ ? "winograd" : lacked_post_ops_ ? "kiln epilogue" : chunked_ ? "chunks of " + std::to_string(chunk_) + " pixels, kiln epilogue" : "";
  }
  // The sum post-op adds to the destination: Y may be Z's memory. Not where kiln's epilogue
  // adds Z after the convolution wrote Y (Winograd without the post-ops: z_index_ is -1).
  int overwrites_input() const override { return z_index_ >= 0 ? 3 : -1; }

 private:
  // The chunked form (chunk_pixels): one primitive over `pixels` pixels as an image [1, C,
  // pixels, 1], bare, bf16 in and f32 out; each thread's scratchpad, f32 rows and oneDNN memory
  // objects and stream of its own.
  Status prepare_chunked(const KernelQuery& q, const ConvGeometry& geo, int64_t pixels, KernelNeeds& needs) {
    chunked_ = true, winograd_ = false, foreign_ = false, lacked_post_ops_ = false, z_index_ = -1;
    chunk_ = pixels, chunks_ = geo.ys[0] * geo.ys[2] * geo.ys[3] / pixels, c_ = geo.xs[1], k_ = geo.ys[1];
    KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
    own_epilogue_ = &cpu::row_kernels(*cpu::best_isa(q.target.cpu));
    has_bias_ = q.has_input(2);
    const memory::desc src = channels_last({1, c_, pixels, 1}, memory::data_type::bf16);
    const memory::desc dst = channels_last({1, k_, pixels, 1}, memory::data_type::f32);
    const memory::desc bias = has_bias_ ? plain({k_}) : memory::desc();
    const memory::desc any_w({k_, c_, 1, 1}, memory::data_type::bf16, memory::format_tag::any);
    dnnl::primitive_attr bare;
    bare.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto pd = primitive_for(q.target, [&] {
      dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, any_w, bias,
                                           dst, {1, 1}, {0, 0}, {0, 0}, {0, 0});
      return dnnl::convolution_forward::primitive_desc(desc, bare, cpu_engine());
    });
    if (!pd) {
      foreign_ = true;
      packed_ = Tensor();
      return {};
    }
    const Tensor& given = *q.inputs[1].value;
    KILN_ASSIGN_OR_RETURN(PrepackedWeights w, prepack_weights(q, given, plain(geo.wdims, memory::data_type::bf16), pd->weights_desc(),
                                                              false, "convolution"));
    weights_ = std::move(w.weights);
    packed_ = std::move(w.packed);
    prim_ = dnnl::convolution_forward(*pd);
    threads_ = std::max(1, q.target.threads);
    rows_at_ = (pd->scratchpad_desc().get_size() + 63) / 64 * 64;
    thread_bytes_ = rows_at_ + static_cast<size_t>(pixels * k_) * sizeof(float);
    per_thread_.clear();
    for (int t = 0; t < threads_; ++t) {
      PerThread& p = per_thread_.emplace_back(PerThread{memory(src, cpu_engine(), nullptr), memory(dst, cpu_engine(), nullptr),
                                                        memory(pd->scratchpad_desc(), cpu_engine(), nullptr),
                                                        has_bias_ ? memory(bias, cpu_engine(), nullptr) : memory(),
                                                        dnnl::stream(cpu_engine()), {}});
      p.args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, p.dst}, {DNNL_ARG_SCRATCHPAD, p.scratch}};
      if (has_bias_) p.args.emplace(DNNL_ARG_BIAS, p.bias);
    }
    needs.workspace_bytes = static_cast<size_t>(threads_) * thread_bytes_;
    return {};
  }

  Status run_chunked(KernelContext& ctx) {
    const auto* x = static_cast<const uint16_t*>(ctx.input(0).raw());
    auto* y = static_cast<uint16_t*>(ctx.output(0).raw());
    void* bias = has_bias_ ? const_cast<void*>(ctx.input(2).raw()) : nullptr;
    std::byte* ws = ctx.workspace().data();
    const int threads = static_cast<int>(std::min<int64_t>(chunks_, std::min(threads_, pool_threads())));
    bool failed = false;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      WorkerSpan span;
      const int t = omp_get_thread_num();
      PerThread& mine = per_thread_[static_cast<size_t>(t)];
      std::byte* base = ws + static_cast<size_t>(t) * thread_bytes_;
      auto* rows = reinterpret_cast<float*>(base + rows_at_);
      const auto [q0, q1] = even_share(chunks_, omp_get_num_threads(), t);
      try {
        mine.dst.set_data_handle(rows);
        mine.scratch.set_data_handle(base);
        if (bias) mine.bias.set_data_handle(bias);
        for (int64_t q = q0; q < q1; ++q) {
          mine.src.set_data_handle(const_cast<uint16_t*>(x + q * chunk_ * c_));
          prim_.execute(mine.stream, mine.args);
          mine.stream.wait();
          uint16_t* out = y + q * chunk_ * k_;
          for (int64_t i = 0; i < chunk_ * k_; i += kEpilogueBlock) {  // each block's epilogue, then rounded, from L1
            const int64_t n = std::min(kEpilogueBlock, chunk_ * k_ - i), whole = n / 32 * 32;
            own_epilogue_->epilogue(rows + i, nullptr, n, act_, post_);
            if (whole > 0) cpu::amx::to_bf16_rows(rows + i, whole, 1, whole, out + i, whole, whole, 1);
            own_epilogue_->narrow_bf16(rows + i + whole, out + i + whole, n - whole);
          }
        }
      } catch (const dnnl::error&) {
#pragma omp atomic write
        failed = true;
      }
    }
    if (failed) return internal_error(ctx.node().where(), "oneDNN failed on a chunk of the convolution");
    return {};
  }

  struct PerThread {
    memory src, dst, scratch, bias;  // handles set at run (the arguments hold the same memories)
    dnnl::stream stream;
    std::unordered_map<int, memory> args;
  };
  bool chunked_ = false;
  int64_t chunk_ = 0, chunks_ = 0, c_ = 0, k_ = 0;
  int threads_ = 1;
  size_t rows_at_ = 0, thread_bytes_ = 0;
  std::vector<PerThread> per_thread_;

  dnnl::convolution_forward prim_;
  Tensor packed_;  // the weights as weights_ holds them, for a compiled model
  dnnl::reorder src_in_, dst_in_, dst_out_;
  memory weights_, src_, dst_, bias_, scratch_, blocked_src_, blocked_dst_, z_plain_;
  // Where the reordered X and Y lie in the workspace; none: the plain tensor is used. (The
  // scratchpad comes first and may be empty, so an offset of 0 is a real one.)
  std::optional<size_t> src_offset_, dst_offset_;
  bool blocked_ = true;
  bool winograd_ = false;
  bool foreign_ = false;  ///< compiled for a CPU oneDNN has no primitive for here (primitive_for)
  bool lacked_post_ops_ = false;  ///< oneDNN's JIT kernels lacked the post-ops: kiln's epilogue after them
  const cpu::RowKernels* own_epilogue_ = nullptr;  ///< set when kiln applies the epilogue
  ActivationSpec act_, post_;
  bool has_z_ = false;
  bool has_bias_ = false;
  int z_index_ = -1;
};

}  // namespace

void register_conv(KernelRegistry& r) {
  for (const char* op : {"Conv", "FusedConv"})
    r.add(op, "cpu", KernelImpl{.name = "onednn.conv",
                                .declines = conv_declines,
                                .create = [](const KernelQuery&) { return std::make_unique<ConvKernel>(); },
                                .reads_packed = true,
                                .tuning_space = conv_space});
}

}  // namespace kiln::onednn
