// kiln.norm_f32_<isa>: LayerNormalization and RMSNormalization on f32 rows with a full scale
// (and bias) over the normalized dims, on the row kernels of the target's ISA.
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

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

}  // namespace

void register_norm(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"LayerNormalization", "RMSNormalization"})
      r.add(op, "cpu",
            KernelImpl{std::string("kiln.norm_f32_") + isa_name(isa), [isa](const KernelQuery& q) { return norm_declines(q, isa); },
                       [isa](const KernelQuery&) { return std::make_unique<NormKernel>(isa); }, isa_features(isa)});
}

}  // namespace kiln::cpu
