// kiln.norm_f32_<isa>: LayerNormalization and RMSNormalization on f32 rows with a full scale
// (and bias) over the normalized dims, on the row kernels of the target's ISA.
// kiln.qnorm_<isa>: QLayerNormalization (lower_int8's DequantizeLinear -> LayerNormalization ->
// QuantizeLinear) row by row, so the f32 tensors between the three never reach memory: on
// AVX-512 the row's mean and variance from its codes' integer sums, then one pass that
// normalizes and quantizes by the scale and bias with y's quantization folded in (prepared
// once); on AVX2 the row dequantized into a thread's f32 row in L1, normalized there and
// quantized (kiln.dequantize, kiln.norm_f32 and kiln.quantize's arithmetic, bit for bit).
#include <algorithm>
#include <vector>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

struct NormShape {
  int64_t rows = 1, d = 1;
};

std::optional<NormShape> norm_shape(const KernelQuery& q) {
  const Shape& xs = q.inputs[0].shape;
  if (!xs.is_concrete() || xs.rank() < 1) return std::nullopt;
  int64_t axis = q.node.attr_int("axis", -1);
  if (axis < 0) axis += xs.rank();
  if (axis < 0 || axis >= xs.rank()) return std::nullopt;
  NormShape s;
  for (int64_t i = 0; i < xs.rank(); ++i) (i < axis ? s.rows : s.d) *= xs.dims[static_cast<size_t>(i)].value;
  return s;
}

std::optional<std::string> norm_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && in.dtype != DType::f32) return "not f32";
  std::optional<NormShape> s = norm_shape(q);
  if (!s) return "the input's shape is not known ahead";
  for (size_t i = 1; i < q.inputs.size(); ++i)
    if (q.inputs[i].dtype != DType::undefined &&
        (!q.inputs[i].shape.is_concrete() || shape_numel(q.inputs[i].shape.concrete()) != s->d))
      return "scale or bias broadcasts";
  for (size_t i = 1; i < q.outputs.size(); ++i)
    if (q.outputs[i].dtype != DType::undefined) return "Mean / InvStdDev outputs";
  if (q.node.attr_int("stash_type", 1) != 1) return "stash_type is not f32";
  return std::nullopt;
}

class NormKernel final : public Kernel {
 public:
  explicit NormKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    shape_ = *norm_shape(q);
    eps_ = static_cast<float>(q.node.attr_float("epsilon", 1e-5f));
    rms_ = q.node.op == "RMSNormalization";
    return {};
  }
  Status run(KernelContext& ctx) override {
    const float* bias = !rms_ && ctx.has_input(2) ? ctx.input(2).data<float>() : nullptr;
    rows_.norm(ctx.input(0).data<float>(), ctx.input(1).data<float>(), bias, ctx.output(0).data<float>(), shape_.rows,
               shape_.d, eps_, rms_);
    return {};
  }

 private:
  const RowKernels& rows_;
  NormShape shape_;
  float eps_ = 0;
  bool rms_ = false;
};

// QLayerNormalization's inputs: x, x_scale, x_zero_point, scale, y_scale, y_zero_point, B.
constexpr size_t kQScale = 3, kYScale = 4, kYZero = 5, kQBias = 6;

std::optional<std::string> qnorm_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.inputs.size() < 6 || !is_int8(q.inputs[0].dtype) || q.outputs.empty() || !is_int8(q.outputs[0].dtype)) return "not int8";
  for (size_t i : {size_t{1}, size_t{2}, kYScale, kYZero})
    if (!q.inputs[i].value || q.inputs[i].value->numel() != 1) return "a scale or zero point is not a constant scalar";
  if (q.inputs[1].dtype != DType::f32 || q.inputs[kYScale].dtype != DType::f32) return "the scales are not f32";
  std::optional<NormShape> s = norm_shape(q);
  if (!s) return "the input's shape is not known ahead";
  for (size_t i : {kQScale, kQBias})
    if (i < q.inputs.size() && q.inputs[i].dtype != DType::undefined &&
        (q.inputs[i].dtype != DType::f32 || !q.inputs[i].value || q.inputs[i].value->numel() != s->d))
      return "scale or bias is not an f32 constant over the normalized dims";
  if (q.node.attr_int("stash_type", 1) != 1) return "stash_type is not f32";
  return std::nullopt;
}

class QNormKernel final : public Kernel {
 public:
  explicit QNormKernel(Isa isa) : isa_(isa), rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    shape_ = *norm_shape(q);
    p_.eps = static_cast<float>(q.node.attr_float("epsilon", 1e-5f));
    p_.x = {constant_scalar(q.inputs[1]), constant_zero_point(q.inputs[2]), q.inputs[0].dtype == DType::u8};
    p_.y = {constant_scalar(q.inputs[kYScale]), constant_zero_point(q.inputs[kYZero]), q.outputs[0].dtype == DType::u8};
    const Tensor& scale = *q.inputs[kQScale].value;
    scale_.assign(scale.data<float>(), scale.data<float>() + scale.numel());
    if (kQBias < q.inputs.size() && q.inputs[kQBias].value) {
      const Tensor& bias = *q.inputs[kQBias].value;
      bias_.assign(bias.data<float>(), bias.data<float>() + bias.numel());
    }
    scale_y_.resize(scale_.size());
    bias_y_.resize(scale_.size());
    for (size_t i = 0; i < scale_.size(); ++i) {
      scale_y_[i] = scale_[i] / p_.y.scale;
      bias_y_[i] = (bias_.empty() ? 0.f : bias_[i] / p_.y.scale) + static_cast<float>(p_.y.zero);
    }
    p_.scale = scale_.data();
    p_.bias = bias_.empty() ? nullptr : bias_.data();
    p_.scale_y = scale_y_.data();
    p_.bias_y = bias_y_.data();
    threads_ = std::max(1, q.target.threads);
    // AVX2's rows go through an f32 row per thread, each on its own cache lines; AVX-512's do not.
    ld_ = isa_ == Isa::avx512 ? 0 : (shape_.d + 15) / 16 * 16;
    needs.workspace_bytes = static_cast<size_t>(threads_ * ld_) * sizeof(float);
    return {};
  }
  Status run(KernelContext& ctx) override {
    float* rows_f32 = ld_ ? reinterpret_cast<float*>(ctx.workspace().data()) : nullptr;
    rows_.qnorm(p_, ctx.input(0).raw(), ctx.output(0).raw(), shape_.rows, shape_.d, rows_f32, ld_, std::min(threads_, pool_threads()));
    return {};
  }

 private:
  Isa isa_;
  const RowKernels& rows_;
  NormShape shape_;
  QNormParams p_;
  std::vector<float> scale_, bias_, scale_y_, bias_y_;
  int threads_ = 1;
  int64_t ld_ = 0;
};

}  // namespace

void register_norm(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"LayerNormalization", "RMSNormalization"})
      r.add(op, "cpu",
            KernelImpl{std::string("kiln.norm_f32_") + isa_name(isa), [isa](const KernelQuery& q) { return norm_declines(q, isa); },
                       [isa](const KernelQuery&) { return std::make_unique<NormKernel>(isa); }, isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("QLayerNormalization", "cpu",
          KernelImpl{std::string("kiln.qnorm_") + isa_name(isa), [isa](const KernelQuery& q) { return qnorm_declines(q, isa); },
                     [isa](const KernelQuery&) { return std::make_unique<QNormKernel>(isa); }, isa_features(isa)});
}

}  // namespace kiln::cpu
