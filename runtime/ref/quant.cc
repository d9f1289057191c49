// Reference kernels of the quant family: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.
// They follow the ONNX reference implementation's arithmetic exactly (division by the scale in
// the promoted float type, round half to even, saturation), because a QDQ model's accuracy is
// judged against that reference and an off-by-one quantum is a real mismatch.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernel.h"
#include "runtime/ref/quant_util.h"

namespace kiln {

namespace quant_ref {

Result<ParamIndex> ParamIndex::make(const KernelContext& ctx, const Tensor& x, const Tensor& p) {
  ParamIndex ix;
  const Node& n = ctx.node();
  int64_t block = n.attr_int("block_size", 0);
  if (p.numel() == 1 && (p.rank() <= 1 || block == 0)) return ix;
  int64_t axis = n.attr_int("axis", 1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank())
    return ctx.error("axis " + std::to_string(n.attr_int("axis", 1)) + " is out of range for rank " + std::to_string(x.rank()));
  ix.axis_dim = x.dim(axis);
  ix.inner = 1;
  for (int64_t d = axis + 1; d < x.rank(); ++d) ix.inner *= x.dim(d);
  if (block == 0) {
    if (p.rank() != 1 || p.dim(0) != ix.axis_dim)
      return ctx.error("quantization parameter of shape " + shape_str(p.shape()) + " does not match axis " +
                       std::to_string(axis) + " of input shape " + shape_str(x.shape()));
    ix.mode = 1;
    return ix;
  }
  ix.mode = 2;
  ix.block = block;
  ix.nblocks = (ix.axis_dim + block - 1) / block;
  int64_t want = x.numel() / std::max<int64_t>(ix.axis_dim, 1) * ix.nblocks;
  if (p.rank() != x.rank() || (x.numel() > 0 && p.numel() != want))
    return ctx.error("blocked quantization parameter of shape " + shape_str(p.shape()) + " does not match input shape " +
                     shape_str(x.shape()) + " with block_size " + std::to_string(block));
  return ix;
}

}  // namespace quant_ref

namespace {

using quant_ref::ParamIndex;
using quant_ref::saturate_round;

// Float type numpy gives `a / b` for two float dtypes (f16 and bf16 stay themselves).
DType promote_float(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;
}

// Rounds a quotient computed in double to the precision of `t`, as numpy's f16/f32 division does.
double round_to(DType t, double v) {
  switch (t) {
    case DType::f32: return static_cast<float>(v);
    case DType::f16: return static_cast<float>(half(static_cast<float>(v)));
    case DType::bf16: return static_cast<float>(bfloat16(static_cast<float>(v)));
    default: return v;
  }
}

Status ref_quantize(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& s = ctx.input(1);
  const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  Tensor& y = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(ParamIndex si, ParamIndex::make(ctx, x, s));
  ParamIndex zi;
  if (zp) {
    KILN_ASSIGN_OR_RETURN(zi, ParamIndex::make(ctx, x, *zp));
  }
  DType prec = promote_float(x.dtype(), s.dtype());
  if (ctx.node().has_attr("precision"))
    if (auto p = dtype_from_name(ctx.node().attr_string("precision", ""))) prec = *p;
  // Operands are rounded to the division's precision first, as numpy's astype does.
  auto quotient = [&](int64_t i) {
    double xv = round_to(prec, x.as_double(i));
    double sv = round_to(prec, s.as_double(si(i)));
    return round_to(prec, xv / sv);
  };
  if (is_int4(y.dtype())) {
    const int lo = y.dtype() == DType::i4 ? -8 : 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double q = quotient(i);
      const double r = (std::isnan(q) ? 0.0 : std::nearbyint(q)) + static_cast<double>(zp ? zp->as_int64(zi(i)) : 0);
      set_int4(y.raw(), i, static_cast<int>(std::clamp(r, static_cast<double>(lo), static_cast<double>(lo + 15))));
    }
    return {};
  }
  return visit_dtype(y.dtype(), [&](auto out_tag) -> Status {
    using Q = decltype(out_tag);
    if constexpr (std::is_integral_v<Q> && !std::is_same_v<Q, bool>) {
      Q* out = y.data<Q>();
      for (int64_t i = 0; i < x.numel(); ++i) out[i] = saturate_round<Q>(quotient(i), zp ? zp->as_int64(zi(i)) : 0);
      return {};
    } else {
      return ctx.error("output type " + std::string(dtype_name(y.dtype())) + " is not an integer type");
    }
  });
}

Status ref_dequantize(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& s = ctx.input(1);
  const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  Tensor& y = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(ParamIndex si, ParamIndex::make(ctx, x, s));
  ParamIndex zi;
  if (zp) {
    KILN_ASSIGN_OR_RETURN(zi, ParamIndex::make(ctx, x, *zp));
  }
  // numpy computes in f32 unless i32 data or an f64 scale promote the product to f64.
  const bool wide = x.dtype() == DType::i32 || s.dtype() == DType::f64;
  return visit_dtype(y.dtype(), [&](auto out_tag) -> Status {
    using T = decltype(out_tag);
    T* out = y.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double dx = static_cast<double>(static_cast<float>(x.as_double(i)));
      if (zp) dx -= static_cast<double>(zp->as_int64(zi(i)));
      if (!wide) dx = static_cast<float>(dx);
      double v = dx * s.as_double(si(i));
      if (!wide) v = static_cast<float>(v);
      if constexpr (std::is_same_v<T, double>) out[i] = v;
      else out[i] = static_cast<T>(static_cast<float>(v));
    }
    return {};
  });
}

Status ref_dynamic_quantize(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const float* xv = x.data<float>();
  float lo = 0.0f, hi = 0.0f;  // the range always includes 0, so 0 is exactly representable
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(xv[i])) return ctx.error("input contains NaN at element " + std::to_string(i));
    lo = std::min(lo, xv[i]);
    hi = std::max(hi, xv[i]);
  }
  const float scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
  float zpf = 0.0f - lo / scale;
  zpf = std::max(0.0f, std::min(255.0f, zpf));
  const float zp = std::nearbyint(zpf);
  uint8_t* y = ctx.output(0).data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    float q = std::nearbyint(xv[i] / scale) + zp;
    y[i] = static_cast<uint8_t>(std::max(0.0f, std::min(255.0f, q)));
  }
  ctx.output(1).data<float>()[0] = scale;
  ctx.output(2).data<uint8_t>()[0] = static_cast<uint8_t>(zp);
  return {};
}

}  // namespace

void register_ref_quant(KernelRegistry& r) {
  r.add_reference("QuantizeLinear", ref_quantize);
  r.add_reference("DequantizeLinear", ref_dequantize);
  r.add_reference("DynamicQuantizeLinear", ref_dynamic_quantize);
  register_ref_quant_integer(r);
}

}  // namespace kiln
