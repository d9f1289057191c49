// onednn.attention: Attention on 4-D f32 [batch, heads, seq, head] tensors as two oneDNN
// matmuls around kiln's softmax rows: scores = Q·Kᵀ (K read transposed in place), then per row
// softmax(scores·scale + mask), then Y = P·V. Grouped-query heads need no copy of K or V: the
// query heads sharing a KV head are contiguous, so Q is read as [batch, kv_heads, rep·seq,
// head] against each KV head. The scores take batch·heads·seq·keys floats of workspace (the
// flash kernel, kiln.attention_f32_<isa>, needs none). Masks: additive f32 or boolean
// (true attends), broadcast over batch, heads and query rows; is_causal without a mask.
#include <cmath>
#include <limits>
#include <unordered_map>

#include "runtime/cpu/rows.h"
#include "runtime/onednn/onednn.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::optional<std::string> onednn_attention_declines(const KernelQuery& q) {
  if (!cpu::best_isa(q.target.cpu)) return "the CPU has neither AVX2 nor AVX-512";
  if (auto why = attention_declines(q)) return why;
  if (attention_rotary(q)) return "rotary embedding";
  if (attention_bf16_products(q)) return "bf16 products";
  if (attention_lengths(q)) return "sequence lengths (nonpad_kv_seqlen)";
  if (q.node.attr_float("softcap", 0.0) != 0.0) return "softcap";
  if (attention_kv_cache(q)) return "a KV cache";
  if (q.inputs[0].shape.rank() != 4) return "3-D (sequence-major) inputs: grouped query heads are not contiguous there";
  if (q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined) {
    if (q.node.attr_int("is_causal", 0)) return "a mask and is_causal together";
    if (q.inputs[3].shape.concrete().back() != attention_geometry(q)->t + attention_past(q)) return "a mask shorter than the keys";
  }
  return std::nullopt;
}

class AttentionKernel final : public Kernel {
 public:
  explicit AttentionKernel(cpu::Isa isa) : rows_(cpu::row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    return guarded(q.node, [&]() -> Status {
      const std::vector<int64_t> qs = q.inputs[0].shape.concrete(), ks = q.inputs[1].shape.concrete(), vs = q.inputs[2].shape.concrete();
      b_ = qs[0], hq_ = qs[1], s_ = qs[2], hkv_ = ks[1], t_ = ks[2];
      const int64_t d = qs[3], dv = vs[3], rep = hq_ / hkv_;
      scale_ = static_cast<float>(q.node.attr_float("scale", 1.0 / std::sqrt(static_cast<double>(d))));
      const memory::desc qmd = plain({b_, hkv_, rep * s_, d}), kmd = transposed({b_, hkv_, d, t_}),
                         smd = plain({b_, hkv_, rep * s_, t_}), vmd = plain({b_, hkv_, t_, dv}), ymd = plain({b_, hkv_, rep * s_, dv});
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::matmul::primitive_desc qk(dnnl::matmul::desc(qmd, kmd, smd), attr, cpu_engine());
      dnnl::matmul::primitive_desc pv(dnnl::matmul::desc(smd, vmd, ymd), attr, cpu_engine());
      qk_ = dnnl::matmul(qk);
      pv_ = dnnl::matmul(pv);
      q_ = memory(qmd, cpu_engine(), nullptr);
      k_ = memory(kmd, cpu_engine(), nullptr);
      v_ = memory(vmd, cpu_engine(), nullptr);
      y_ = memory(ymd, cpu_engine(), nullptr);
      scores_ = memory(smd, cpu_engine(), nullptr);
      qk_scratch_ = memory(qk.scratchpad_desc(), cpu_engine(), nullptr);
      pv_scratch_ = memory(pv.scratchpad_desc(), cpu_engine(), nullptr);
      // The mask's strides over (batch, head, query row); a boolean or causal mask becomes an
      // additive one in the workspace.
      has_mask_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
      bool_mask_ = has_mask_ && q.inputs[3].dtype == DType::boolean;
      std::vector<int64_t> md = {1, 1, s_, t_};
      if (has_mask_) {
        md = q.inputs[3].shape.concrete();
        md.insert(md.begin(), 4 - md.size(), 1);
      }
      mask_elems_ = md[0] * md[1] * md[2] * md[3];
      mask_sb_ = md[0] > 1 ? md[1] * md[2] * t_ : 0;
      mask_sh_ = md[1] > 1 ? md[2] * t_ : 0;
      mask_si_ = md[2] > 1 ? t_ : 0;
      if (!has_mask_ && q.node.attr_int("is_causal", 0)) {
        causal_.assign(static_cast<size_t>(s_ * t_), 0.f);
        for (int64_t i = 0; i < s_; ++i)
          for (int64_t j = i + 1; j < t_; ++j) causal_[static_cast<size_t>(i * t_ + j)] = -kInf;
      }
      auto up = [](size_t b) { return (b + 63) / 64 * 64; };
      scores_bytes_ = up(smd.get_size());
      mask_bytes_ = bool_mask_ ? up(static_cast<size_t>(mask_elems_) * sizeof(float)) : 0;
      needs.workspace_bytes = scores_bytes_ + mask_bytes_ + up(std::max(qk.scratchpad_desc().get_size(), pv.scratchpad_desc().get_size()));
      return {};
    });
  }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      std::span<std::byte> ws = ctx.workspace();
      float* scores = reinterpret_cast<float*>(ws.data());
      std::byte* scratch = ws.data() + scores_bytes_ + mask_bytes_;
      q_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      k_.set_data_handle(const_cast<void*>(ctx.input(1).raw()));
      v_.set_data_handle(const_cast<void*>(ctx.input(2).raw()));
      y_.set_data_handle(ctx.output(0).raw());
      scores_.set_data_handle(scores);
      qk_scratch_.set_data_handle(scratch);
      pv_scratch_.set_data_handle(scratch);
      qk_.execute(cpu_stream(), {{DNNL_ARG_SRC, q_}, {DNNL_ARG_WEIGHTS, k_}, {DNNL_ARG_DST, scores_}, {DNNL_ARG_SCRATCHPAD, qk_scratch_}});
      cpu_stream().wait();
      const float* mask = causal_.empty() ? nullptr : causal_.data();
      if (has_mask_) {
        if (bool_mask_) {
          float* m = reinterpret_cast<float*>(ws.data() + scores_bytes_);
          const bool* src = ctx.input(3).data<bool>();
          for (int64_t i = 0; i < mask_elems_; ++i) m[i] = src[i] ? 0.f : -kInf;
          mask = m;
        } else {
          mask = ctx.input(3).data<float>();
        }
      }
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t b = 0; b < b_; ++b)
        for (int64_t h = 0; h < hq_; ++h) {
          const float* m = mask ? mask + b * mask_sb_ + h * mask_sh_ : nullptr;
          rows_.softmax(scores + (b * hq_ + h) * s_ * t_, s_, t_, scale_, m, mask_si_);
        }
      pv_.execute(cpu_stream(), {{DNNL_ARG_SRC, scores_}, {DNNL_ARG_WEIGHTS, v_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_SCRATCHPAD, pv_scratch_}});
      cpu_stream().wait();
      return {};
    });
  }

 private:
  const cpu::RowKernels& rows_;
  dnnl::matmul qk_, pv_;
  memory q_, k_, v_, y_, scores_, qk_scratch_, pv_scratch_;
  int64_t b_ = 0, hq_ = 0, s_ = 0, hkv_ = 0, t_ = 0;
  float scale_ = 1;
  bool has_mask_ = false, bool_mask_ = false;
  int64_t mask_elems_ = 0, mask_sb_ = 0, mask_sh_ = 0, mask_si_ = 0;
  std::vector<float> causal_;
  size_t scores_bytes_ = 0, mask_bytes_ = 0;
};

}  // namespace

void register_attention(KernelRegistry& r) {
  r.add("Attention", "cpu",
        KernelImpl{"onednn.attention", onednn_attention_declines, [](const KernelQuery& q) {
                     return std::make_unique<AttentionKernel>(*cpu::best_isa(q.target.cpu));
                   },
                   cpu::isa_features(cpu::Isa::avx2)});
}

}  // namespace kiln::onednn
