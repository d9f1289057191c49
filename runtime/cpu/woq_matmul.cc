// kiln.matmul_woq_avx512: WoqFusedMatMul (a linear layer whose weight `kiln quant --weight-only`
// stored as int8 or int4 codes) on kiln's weight-only GEMM (runtime/cpu/gemm/woq.h): B's codes,
// scales and zero points packed once at plan time, dequantized in the micro-kernel's loads (or,
// for a decode step's few rows on VNNI, multiplied as integers by A split into
// 16-bit integers: label `a16x2_vnni`); the bias, activations and residual in the GEMM's
// epilogue.
#include "formats/huge_pages.h"
#include "runtime/cpu/gemm/woq.h"
#include "runtime/cpu/linear.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

gemm::WoqCodes codes_of(DType t) {
  switch (t) {
    case DType::u8: return gemm::WoqCodes::u8;
    case DType::i4: return gemm::WoqCodes::s4;
    case DType::u4: return gemm::WoqCodes::u4;
    default: return gemm::WoqCodes::s8;
  }
}

std::optional<std::string> woq_declines(const KernelQuery& q) {
  if (auto why = gemm::woq_lacks(q.target.cpu)) return why;
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const InferInput& in = q.inputs[i];
    if (in.dtype == DType::undefined) continue;
    if (!in.shape.is_concrete()) return "input " + std::to_string(i) + " has no concrete shape";
    if (i >= 1 && i <= 3 && !in.value) return "input " + std::to_string(i) + " is computed at run time (B, its scales and zero points must be constant)";
  }
  if (q.inputs[1].shape.rank() != 2) return "B is not 2-D";
  if (shape_numel(q.inputs[1].shape.concrete()) == 0) return "B is empty (the reference writes the bias alone)";
  if (q.inputs[0].shape.rank() < 1) return "A is a scalar";
  return std::nullopt;
}

class WoqMatMulKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    KILN_ASSIGN_OR_RETURN(const LinearDims d, linear_dims(q, 1));
    m_ = d.m, n_ = d.n, k_ = d.k;
    threads_ = std::max(1, q.target.threads);
    // The scales (and zero points) as the packer reads them: one per column, per group and
    // column, or (per tensor) the one value repeated per column.
    group_ = q.node.attr_int("block_size", 0);
    const Tensor& scale = *q.inputs[2].value;
    const int64_t want = group_ ? (k_ + group_ - 1) / group_ * n_ : scale.numel() == 1 ? 1 : n_;
    if (scale.numel() != want)
      return user_error(q.node.where(), "b_scale has " + std::to_string(scale.numel()) + " values; B needs " + std::to_string(want));
    const bool has_zero = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    if (has_zero && q.inputs[3].value->numel() != scale.numel())
      return user_error(q.node.where(), "b_zero_point's shape differs from b_scale's");
    const int64_t per = group_ ? scale.numel() : n_;
    std::vector<float> scales(static_cast<size_t>(per));
    std::vector<int32_t> zeros(has_zero ? static_cast<size_t>(per) : 0);
    for (int64_t i = 0; i < per; ++i) {
      const int64_t at = scale.numel() == 1 ? 0 : i;
      scales[static_cast<size_t>(i)] = static_cast<float>(scale.as_double(at));
      if (has_zero) zeros[static_cast<size_t>(i)] = static_cast<int32_t>(q.inputs[3].value->as_int64(at));
    }
    codes_ = codes_of(q.inputs[1].dtype);
    gemm::WoqWeight w;
    w.codes = codes_;
    w.data = q.inputs[1].value->raw();
    w.trans = d.trans;
    w.k = k_;
    w.n = n_;
    w.group = group_;
    w.scale = scales.data();
    w.zero = has_zero ? zeros.data() : nullptr;
    packed_ = huge_page_tensor(DType::u8, {gemm::packed_b_woq_bytes(w)});
    gemm::pack_b_woq(w, static_cast<std::byte*>(packed_.raw()));
    has_bias_ = q.inputs.size() > 4 && q.inputs[4].dtype != DType::undefined;
    if (has_bias_ && q.inputs[4].value) {  // a constant bias is copied once; a computed one is read each run
      const float* b = q.inputs[4].value->data<float>();
      bias_.assign(b, b + n_);
    }
    has_z_ = q.inputs.size() > 5 && q.inputs[5].dtype != DType::undefined;
    KILN_ASSIGN_OR_RETURN(ep_.act, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(ep_.post, read_activation(q.node, "post_activation"));
    ep_.ldz = n_;
    split_a_ = gemm::woq_splits_a(q.target.cpu, m_, group_);
    needs.workspace_bytes = gemm::woq_workspace_bytes(m_, n_, k_, group_, threads_, split_a_);
    return {};
  }

  // The 16-bit path (woq.h) where this CPU takes it: A as two 16-bit integers a value, on VNNI.
  std::string label() const override { return split_a_ ? "a16x2_vnni" : ""; }

  Status run(KernelContext& ctx) override {
    gemm::Epilogue ep = ep_;
    if (has_bias_) ep.bias = bias_.empty() ? ctx.input(4).data<float>() : bias_.data();
    if (has_z_) ep.z = ctx.input(5).data<float>();
    gemm::gemm_woq(m_, n_, k_, ctx.input(0).data<float>(), k_, static_cast<const std::byte*>(packed_.raw()), codes_, group_, split_a_, ep,
                   ctx.output(0).data<float>(), n_, threads_, ctx.workspace().data());
    return {};
  }

 private:
  int64_t m_ = 0, n_ = 0, k_ = 0, group_ = 0;
  int threads_ = 1;
  bool split_a_ = false;  // the 16-bit path (gemm::woq_splits_a on the target CPU)
  gemm::WoqCodes codes_ = gemm::WoqCodes::s8;
  Tensor packed_;
  std::vector<float> bias_;
  bool has_bias_ = false, has_z_ = false;
  gemm::Epilogue ep_;
};

}  // namespace

void register_woq_matmul(KernelRegistry& r) {
  r.add("WoqFusedMatMul", "cpu",
        KernelImpl{.name = "kiln.matmul_woq_avx512",
                   .declines = woq_declines,
                   .create = [](const KernelQuery&) { return std::make_unique<WoqMatMulKernel>(); },
                   .needs_isa = isa_features(Isa::avx512)});
}

}  // namespace kiln::cpu
