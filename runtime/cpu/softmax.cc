// kiln.softmax_f32_<isa>: Softmax over the last axis of an f32 tensor (a standalone attention
// softmax, a classifier's head) on the row kernels of the target's ISA, with the vectorised e^x
// the attention kernel uses; the reference kernel calls libm per element. Other axes stay on
// the reference kernel.
#include <cstring>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> softmax_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.inputs[0].dtype != DType::f32) return "not f32";
  const int64_t rank = q.inputs[0].shape.rank();
  if (rank < 1) return "the rank is not known ahead or is 0";
  const int64_t axis = q.node.attr_int("axis", -1);
  if (axis != -1 && axis != rank - 1) return "the axis is not the last";
  return std::nullopt;
}

class SoftmaxKernel final : public Kernel {
 public:
  explicit SoftmaxKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0);
    const int64_t n = x.rank() ? x.dim(x.rank() - 1) : 1;
    if (x.numel() == 0) return {};
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    rows_.softmax(y.data<float>(), x.numel() / n, n, 1.f, nullptr, 0);
    return {};
  }

 private:
  const RowKernels& rows_;
};

}  // namespace

void register_softmax(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("Softmax", "cpu",
          KernelImpl{std::string("kiln.softmax_f32_") + isa_name(isa), [isa](const KernelQuery& q) { return softmax_declines(q, isa); },
                     [isa](const KernelQuery&) { return std::make_unique<SoftmaxKernel>(isa); }, isa_features(isa)});
}

}  // namespace kiln::cpu
