// onednn.cast: Cast between f32 and bf16 as a oneDNN reorder of the flat tensor (vectorised,
// on kiln's OpenMP pool; f32 to bf16 rounds to nearest even, as the reference does): a model's
// own Casts, and those `kiln compile --precision bf16` gives a convolution's residual whose
// type is not its output's. On CPUs with AVX512-BF16 only: oneDNN's reorder elsewhere (AVX2)
// loses the sign of a zero, so the reference kernel casts there.
#include <unordered_map>

#include "runtime/onednn/onednn.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

std::optional<std::string> cast_declines(const KernelQuery& q) {
  // oneDNN 2.6's reorder without it turns -0 into +0 (f32 -> bf16, and back).
  if (!q.target.cpu.avx512_bf16) return "the CPU lacks avx512-bf16 (oneDNN's conversion would drop the sign of zero)";
  const DType from = q.inputs[0].dtype, to = q.outputs[0].dtype;
  if (!((from == DType::f32 && to == DType::bf16) || (from == DType::bf16 && to == DType::f32))) return "not between f32 and bf16";
  if (!q.inputs[0].shape.is_concrete() || shape_numel(q.inputs[0].shape.concrete()) == 0) return "the input is empty or not concrete";
  return std::nullopt;
}

memory::data_type type_of(DType t) { return t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

class CastKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    return guarded(q.node, [&]() -> Status {
      const std::vector<int64_t> flat = {shape_numel(q.inputs[0].shape.concrete())};
      const memory::desc src = plain(flat, type_of(q.inputs[0].dtype)), dst = plain(flat, type_of(q.outputs[0].dtype));
      prim_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src, cpu_engine(), dst));
      src_ = memory(src, cpu_engine(), nullptr);
      dst_ = memory(dst, cpu_engine(), nullptr);
      return {};
    });
  }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      src_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      dst_.set_data_handle(ctx.output(0).raw());
      prim_.execute(cpu_stream(), src_, dst_);
      cpu_stream().wait();
      return {};
    });
  }

 private:
  dnnl::reorder prim_;
  memory src_, dst_;
};

}  // namespace

void register_cast(KernelRegistry& r) {
  r.add("Cast", "cpu", KernelImpl{"onednn.cast", cast_declines, [](const KernelQuery&) { return std::make_unique<CastKernel>(); }});
}

}  // namespace kiln::onednn
