// kiln.activation_f32_<isa>: the activations a fused epilogue has (Relu, LeakyRelu, Clip with
// constant bounds, Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu in either form) as standalone f32
// nodes, on the row kernels of the target's ISA: the reference kernels call libm per element
// (erf, tanh, exp), these run polynomials in vector registers.
#include <limits>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

// The node's activation, when its inputs make it one (f32 data; Clip's bounds constant
// one-element f32 tensors).
std::optional<ActivationSpec> activation_spec(const KernelQuery& q) {
  float bounds[2] = {std::numeric_limits<float>::lowest(), std::numeric_limits<float>::max()};
  for (size_t slot = 1; slot < q.inputs.size() && slot <= 2; ++slot) {
    const InferInput& in = q.inputs[slot];
    if (in.dtype == DType::undefined) continue;
    if (in.dtype != DType::f32 || !in.value || in.value->numel() != 1) return std::nullopt;
    bounds[slot - 1] = in.value->data<float>()[0];
  }
  return activation_of_node(q.node, bounds[0], bounds[1]);
}

std::optional<std::string> activation_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.inputs.empty() || q.inputs[0].dtype != DType::f32) return "not f32";
  if (!activation_spec(q)) return "Clip's bounds are not constant f32 scalars";
  return std::nullopt;
}

class ActivationKernel final : public Kernel {
 public:
  explicit ActivationKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    spec_ = *activation_spec(q);
    in_place_ = q.target.threads <= 1;
    return {};
  }
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    rows_.activation(x.data<float>(), ctx.output(0).data<float>(), x.numel(), spec_);
    return {};
  }
  // Elementwise: Y may take X's memory where X dies here (each value read before it is written),
  // on one thread (binary.cc, which shares rows in the producer's order, writes in place on two).
  int overwrites_input() const override { return in_place_ ? 0 : -1; }

 private:
  const RowKernels& rows_;
  ActivationSpec spec_;
  bool in_place_ = false;
};

}  // namespace

void register_activation(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu"})
      r.add(op, "cpu",
            KernelImpl{std::string("kiln.activation_f32_") + isa_name(isa),
                       [isa](const KernelQuery& q) { return activation_declines(q, isa); },
                       [isa](const KernelQuery&) { return std::make_unique<ActivationKernel>(isa); }, isa_features(isa)});
}

}  // namespace kiln::cpu
