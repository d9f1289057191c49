// kiln.quantize_<isa> / kiln.dequantize_<isa>: per-tensor QuantizeLinear (f32 -> u8 / s8) and
// DequantizeLinear (u8 / s8 -> f32) with constant scale and zero point, on the row kernels of
// the target's ISA: where a quantized model's int8 region starts and ends (the reference kernels
// work in double per element, 40 times slower). Bit-exact with the reference.
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

bool int8(DType t) { return t == DType::u8 || t == DType::i8; }

std::optional<std::string> qdq_declines(const KernelQuery& q, Isa isa, bool quantize) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.inputs.size() != 3 || q.inputs[2].dtype == DType::undefined) return "no zero point";
  const DType data = q.inputs[0].dtype, out = q.outputs[0].dtype;
  if (quantize ? data != DType::f32 || !int8(out) : !int8(data) || out != DType::f32) return "not f32 <-> u8 / s8";
  for (size_t i = 1; i < 3; ++i)
    if (!q.inputs[i].value || q.inputs[i].value->numel() != 1) return "the scale or zero point is not a constant scalar";
  if (q.inputs[1].dtype != DType::f32) return "the scale is not f32";
  if (q.node.attr_int("block_size", 0) != 0) return "blocked quantization";
  if (!q.node.attr_string("precision", "").empty()) return "a precision attribute";
  return std::nullopt;
}

class QdqKernel final : public Kernel {
 public:
  QdqKernel(Isa isa, bool quantize) : rows_(row_kernels(isa)), quantize_(quantize) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    scale_ = q.inputs[1].value->data<float>()[0];
    zero_ = static_cast<int32_t>(q.inputs[2].value->to_double_vector()[0]);
    u8_ = q.inputs[2].dtype == DType::u8;
    return {};
  }
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0);
    if (quantize_) rows_.quantize(x.data<float>(), y.raw(), x.numel(), scale_, zero_, u8_);
    else rows_.dequantize(x.raw(), y.data<float>(), x.numel(), scale_, zero_, u8_);
    return {};
  }

 private:
  const RowKernels& rows_;
  bool quantize_;
  float scale_ = 1;
  int32_t zero_ = 0;
  bool u8_ = true;
};

}  // namespace

void register_quant(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (bool quantize : {true, false})
      r.add(quantize ? "QuantizeLinear" : "DequantizeLinear", "cpu",
            KernelImpl{std::string(quantize ? "kiln.quantize_" : "kiln.dequantize_") + isa_name(isa),
                       [isa, quantize](const KernelQuery& q) { return qdq_declines(q, isa, quantize); },
                       [isa, quantize](const KernelQuery&) { return std::make_unique<QdqKernel>(isa, quantize); },
                       isa_features(isa)});
}

}  // namespace kiln::cpu
