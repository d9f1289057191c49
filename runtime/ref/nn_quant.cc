// Reference kernels of the quantized ops `kiln compile` makes (lower_int8): QFusedConv and
// QFusedMatMul are FusedConv and FusedMatMul on their int8 operands dequantized (the weight per
// tensor or per output channel), WoqFusedMatMul a FusedMatMul by its weight dequantized as
// DequantizeLinear does, QAdd an Add of them, QMul a Mul of one by f32 factors,
// QGlobalAveragePool a GlobalAveragePool, QLayerNormalization a LayerNormalization,
// QAttention an Attention, the f32 result quantized as QuantizeLinear does (divided in f32,
// rounded half to even, saturated) when the node has y's scale and zero point; LookupTable
// gives each code's entry of its table.
#include <array>

#include "runtime/ref/activation.h"
#include "runtime/ref/layout.h"
#include "runtime/ref/nn_util.h"
#include "runtime/ref/quant_util.h"

namespace kiln::nn {

namespace {

using ref::ViewContext;

// (q − zero) · scale; `scale` and `zero` are scalars or one value per slice of dim `axis`.
Tensor dequantized(const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t axis) {
  Tensor out(DType::f32, q.shape());
  const std::vector<double> v = q.to_double_vector(), zp = zero.to_double_vector();
  const float* s = scale.data<float>();
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < q.rank(); ++d) inner *= q.dim(d);
  const int64_t channels = scale.numel() > 1 ? q.dim(axis) : 1;
  float* o = out.data<float>();
  for (int64_t i = 0; i < q.numel(); ++i) {
    const size_t c = channels > 1 ? static_cast<size_t>((i / inner) % channels) : 0;
    o[i] = static_cast<float>(v[static_cast<size_t>(i)] - zp[zp.size() > 1 ? c : 0]) * s[scale.numel() > 1 ? c : 0];
  }
  return out;
}

Tensor transposed_2d(const Tensor& t) {
  Tensor out(t.dtype(), {t.dim(1), t.dim(0)});
  for (int64_t i = 0; i < t.dim(0); ++i)
    for (int64_t j = 0; j < t.dim(1); ++j) out.data<float>()[j * t.dim(0) + i] = t.data<float>()[i * t.dim(1) + j];
  return out;
}

// The node as its float op (FusedConv / FusedMatMul) on the dequantized X, W, B and Z, which
// are its inputs `from`.
ViewContext dequantized_view(KernelContext& outer, std::string op, std::array<Tensor, 4> inputs,
                             std::array<size_t, 4> from = {0, 3, 8, 9}) {
  Node node = outer.node();
  node.op = std::move(op);
  node.inputs.assign(4, kNoValue);
  for (size_t k = 0; k < 4; ++k)
    if (inputs[k].defined()) node.inputs[k] = outer.node().inputs[from[k]];
  return ViewContext(outer, std::move(node), std::vector<Tensor>(inputs.begin(), inputs.end()), Tensor(DType::f32, outer.output(0).shape()));
}

// Y from the float result: quantized with inputs `at` and `at` + 1 (y's scale and zero point)
// when the node has them (and dequantized again for an f32 Y: QFusedMatMul's
// dequantize_output), else as is.
Status store(KernelContext& ctx, const Tensor& y, size_t at = 6) {
  Tensor& out = ctx.output(0);
  if (!ctx.has_input(at)) {
    std::copy(y.data<float>(), y.data<float>() + y.numel(), out.data<float>());
    return {};
  }
  if (ctx.input(at).numel() != 1 || !ctx.has_input(at + 1) || ctx.input(at + 1).numel() != 1)
    return ctx.error("y_scale and y_zero_point must be scalars");
  const float scale = ctx.input(at).data<float>()[0];
  const int64_t zero = ctx.input(at + 1).as_int64(0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double v = static_cast<double>(y.data<float>()[i] / scale);
    if (out.dtype() == DType::f32)  // dequantize_output: DequantizeLinear of the u8 value
      out.data<float>()[i] = static_cast<float>(static_cast<int64_t>(quant_ref::saturate_round<uint8_t>(v, zero)) - zero) * scale;
    else if (out.dtype() == DType::u8) out.data<uint8_t>()[i] = quant_ref::saturate_round<uint8_t>(v, zero);
    else out.data<int8_t>()[i] = quant_ref::saturate_round<int8_t>(v, zero);
  }
  return {};
}

Status check_scalars(KernelContext& ctx, std::initializer_list<size_t> inputs) {
  for (size_t i : inputs)
    if (ctx.has_input(i) && ctx.input(i).numel() != 1) return ctx.error("input " + std::to_string(i) + " must be a scalar");
  return {};
}

Status ref_qfused_conv(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 6, 7, 10, 11}));
  std::array<Tensor, 4> in;
  in[0] = dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0);
  in[1] = dequantized(ctx.input(3), ctx.input(4), ctx.input(5), 0);
  if (ctx.has_input(8)) in[2] = ctx.input(8);
  if (ctx.has_input(9)) in[3] = dequantized(ctx.input(9), ctx.input(10), ctx.input(11), 0);
  ViewContext f = dequantized_view(ctx, "FusedConv", std::move(in));
  KILN_RETURN_IF_ERROR(ref_fused_conv_any(f));
  return store(ctx, f.y());
}

Status ref_qfused_matmul(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 6, 7, 10, 11}));
  const bool trans = ctx.node().attr_int("transB", 0) != 0;
  const Tensor& b = ctx.input(3);
  if (b.rank() != 2) return ctx.error("B must be 2-D, got " + shape_str(b.shape()));
  std::array<Tensor, 4> in;
  in[0] = dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0);
  Tensor w = dequantized(b, ctx.input(4), ctx.input(5), trans ? 0 : 1);  // the scales follow B's N dim
  in[1] = trans ? transposed_2d(w) : w;
  if (ctx.has_input(8)) in[2] = ctx.input(8);
  if (ctx.has_input(9))
    in[3] = ctx.input(9).dtype() == DType::f32 ? ctx.input(9) : dequantized(ctx.input(9), ctx.input(10), ctx.input(11), 0);
  ViewContext f = dequantized_view(ctx, "FusedMatMul", std::move(in));
  KILN_RETURN_IF_ERROR(ref_fused_matmul(f));
  return store(ctx, f.y());
}

// WoqFusedMatMul: FusedMatMul by B dequantized as DequantizeLinear does (per tensor, per
// channel or blocked, with or without zero points).
Status ref_woq_fused_matmul(KernelContext& ctx) {
  const bool trans = ctx.node().attr_int("transB", 0) != 0;
  const Tensor& b = ctx.input(1);
  if (b.rank() != 2) return ctx.error("B must be 2-D, got " + shape_str(b.shape()));
  const Tensor& scale = ctx.input(2);
  KILN_ASSIGN_OR_RETURN(quant_ref::ParamIndex si, quant_ref::ParamIndex::make(ctx, b, scale));
  quant_ref::ParamIndex zi;
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(zi, quant_ref::ParamIndex::make(ctx, b, ctx.input(3)));
  }
  Tensor w(DType::f32, b.shape());
  const std::vector<double> s = scale.to_double_vector();
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double z = ctx.has_input(3) ? static_cast<double>(ctx.input(3).as_int64(zi(i))) : 0.0;
    w.data<float>()[i] = static_cast<float>(b.as_double(i) - z) * static_cast<float>(s[static_cast<size_t>(si(i))]);
  }
  std::array<Tensor, 4> in;
  in[0] = ctx.input(0);
  in[1] = trans ? transposed_2d(w) : w;
  if (ctx.has_input(4)) in[2] = ctx.input(4);
  if (ctx.has_input(5)) in[3] = ctx.input(5);
  ViewContext f = dequantized_view(ctx, "FusedMatMul", std::move(in), {0, 1, 4, 5});
  KILN_RETURN_IF_ERROR(ref_fused_matmul(f));
  Tensor& y = ctx.output(0);
  std::copy(f.y().data<float>(), f.y().data<float>() + y.numel(), y.data<float>());
  return {};
}

// f(a's element, b's element) of f32 a and b broadcast (numpy's rules) to y's shape, for each
// element of y.
template <class F>
Tensor broadcast_f32(const Tensor& a, const Tensor& b, const std::vector<int64_t>& ys, F f) {
  Tensor y(DType::f32, ys);
  const size_t r = ys.size();
  auto index = [&](const Tensor& t, int64_t flat) {  // t's element broadcast to y's flat index
    int64_t off = 0, stride = 1;
    for (size_t d = r; d-- > 0;) {
      const int64_t i = flat % ys[d];
      flat /= ys[d];
      const int64_t td = static_cast<int64_t>(d) - static_cast<int64_t>(r) + t.rank();
      if (td < 0) continue;
      if (t.dim(td) != 1) off += i * stride;
      stride *= t.dim(td);
    }
    return off;
  };
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = f(a.data<float>()[index(a, i)], b.data<float>()[index(b, i)]);
  return y;
}

// QAdd: Add of the dequantized operands (numpy broadcasting, as Add's reference), the
// activation, then y quantized.
Status ref_qadd(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 4, 5, 6, 7}));
  const Tensor a = dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0);
  const Tensor b = dequantized(ctx.input(3), ctx.input(4), ctx.input(5), 0);
  KILN_ASSIGN_OR_RETURN(ActivationSpec spec, read_activation(ctx.node(), "activation"));
  Tensor y = broadcast_f32(a, b, ctx.output(0).shape(), [](float u, float v) { return u + v; });
  act::apply(spec, y.data<float>(), y.numel());
  return store(ctx, y);
}

// QMul: a dequantized times f32 b (numpy broadcasting), then y quantized.
Status ref_qmul(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 4, 5}));
  const Tensor a = dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0);
  return store(ctx, broadcast_f32(a, ctx.input(3), ctx.output(0).shape(), [](float u, float v) { return u * v; }), 4);
}

// LookupTable: each code's value in the table (s8 codes shifted by 128 to index it).
Status ref_lookup_table(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& table = ctx.input(1);
  if (table.numel() != 256) return ctx.error("table must hold 256 values");
  const bool s8 = x.dtype() == DType::i8;
  float* y = ctx.output(0).data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = table.data<float>()[static_cast<int64_t>(x.as_double(i)) + (s8 ? 128 : 0)];
  return {};
}

// QGlobalAveragePool: GlobalAveragePool of x dequantized (either layout), then y quantized.
Status ref_qglobal_average_pool(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 3, 4}));
  Node node = ctx.node();
  node.op = "GlobalAveragePool";
  node.inputs = {ctx.node().inputs[0]};
  ViewContext f(ctx, std::move(node), {dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0)},
                Tensor(DType::f32, ctx.output(0).shape()));
  KILN_RETURN_IF_ERROR(ref::global_average_pool(f));
  return store(ctx, f.y(), 3);
}

// QLayerNormalization: LayerNormalization of x dequantized (scale input 3, B input 6), y
// quantized with inputs 4 and 5.
Status ref_qlayer_norm(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 4, 5}));
  Node node = ctx.node();
  node.op = "LayerNormalization";
  node.inputs = {ctx.node().inputs[0], ctx.node().inputs[3], ctx.has_input(6) ? ctx.node().inputs[6] : kNoValue};
  ViewContext f(ctx, std::move(node),
                {dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0), ctx.input(3), ctx.has_input(6) ? ctx.input(6) : Tensor()},
                Tensor(DType::f32, ctx.output(0).shape()));
  KILN_RETURN_IF_ERROR(ref::layer_normalization(f));
  return store(ctx, f.y(), 4);
}

// QAttention: Attention of Q, K and V dequantized (inputs 0, 3, 6 with their scales and zero
// points) and the mask (input 9), y quantized with inputs 10 and 11 when given.
Status ref_qattention(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalars(ctx, {1, 2, 4, 5, 7, 8, 10, 11}));
  const Node& outer = ctx.node();
  Node node = outer;
  node.op = "Attention";
  node.inputs = {outer.inputs[0], outer.inputs[3], outer.inputs[6], ctx.has_input(9) ? outer.inputs[9] : kNoValue};
  ViewContext f(ctx, std::move(node),
                {dequantized(ctx.input(0), ctx.input(1), ctx.input(2), 0), dequantized(ctx.input(3), ctx.input(4), ctx.input(5), 0),
                 dequantized(ctx.input(6), ctx.input(7), ctx.input(8), 0), ctx.has_input(9) ? ctx.input(9) : Tensor()},
                Tensor(DType::f32, ctx.output(0).shape()));
  KILN_RETURN_IF_ERROR(ref::attention(f));
  return store(ctx, f.y(), 10);
}

}  // namespace

void register_ref_nn_quant(KernelRegistry& r) {
  r.add_reference("QAttention", ref_qattention);
  r.add_reference("QAdd", ref_qadd);
  r.add_reference("QMul", ref_qmul);
  r.add_reference("LookupTable", ref_lookup_table);
  r.add_reference("QGlobalAveragePool", ref_qglobal_average_pool);
  r.add_reference("QLayerNormalization", ref_qlayer_norm);
  r.add_reference("QFusedConv", ref_qfused_conv);
  r.add_reference("QFusedMatMul", ref_qfused_matmul);
  r.add_reference("WoqFusedMatMul", ref_woq_fused_matmul);
}

}  // namespace kiln::nn
