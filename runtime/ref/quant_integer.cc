// Reference kernels of the quant family's integer compute ops: MatMulInteger, QLinearMatMul,
// ConvInteger and QLinearConv. Products accumulate in int32 after the zero points are
// subtracted; the QLinear ops then requantize with multiplier (a_scale * b_scale / y_scale)
// computed in the scales' float type and applied in double, like the ONNX reference.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/kernel.h"
#include "runtime/ref/quant_util.h"

namespace kiln {

namespace {

using quant_ref::saturate_round;

// ---- matmul ------------------------------------------------------------------------------

// numpy.matmul geometry: the matrix offsets of a and b for each broadcast batch.
struct MatmulGeom {
  int64_t m = 1, k = 1, n = 1;
  std::vector<int64_t> out_shape;
  std::vector<int64_t> a_mat, b_mat;  // per output batch: matrix index in a / b
  int64_t a_batches = 1, b_batches = 1;
};

Result<MatmulGeom> matmul_geom(const KernelContext& ctx, const Tensor& a, const Tensor& b) {
  MatmulGeom g;
  if (a.rank() == 0 || b.rank() == 0) return ctx.error("matmul operands must have rank >= 1");
  std::vector<int64_t> ad = a.shape(), bd = b.shape();
  bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), 1);
  if (b1) bd.push_back(1);
  g.m = ad[ad.size() - 2];
  g.k = ad.back();
  g.n = bd.back();
  if (bd[bd.size() - 2] != g.k)
    return ctx.error("inner dimensions differ: " + shape_str(a.shape()) + " and " + shape_str(b.shape()));
  std::vector<int64_t> ab(ad.begin(), ad.end() - 2), bb(bd.begin(), bd.end() - 2);
  size_t rank = std::max(ab.size(), bb.size());
  ab.insert(ab.begin(), rank - ab.size(), 1);
  bb.insert(bb.begin(), rank - bb.size(), 1);
  std::vector<int64_t> batch(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (ab[i] != bb[i] && ab[i] != 1 && bb[i] != 1)
      return ctx.error("cannot broadcast batch dims of " + shape_str(a.shape()) + " and " + shape_str(b.shape()));
    batch[i] = ab[i] == 1 ? bb[i] : ab[i];
  }
  for (int64_t d : ab) g.a_batches *= d;
  for (int64_t d : bb) g.b_batches *= d;
  int64_t total = 1;
  for (int64_t d : batch) total *= d;
  for (int64_t t = 0; t < total; ++t) {
    int64_t rem = t, ai = 0, bi = 0, astride = 1, bstride = 1;
    for (size_t i = rank; i-- > 0;) {
      int64_t c = rem % batch[i];
      rem /= batch[i];
      if (ab[i] != 1) ai += c * astride;
      if (bb[i] != 1) bi += c * bstride;
      astride *= ab[i];
      bstride *= bb[i];
    }
    g.a_mat.push_back(ai);
    g.b_mat.push_back(bi);
  }
  g.out_shape = batch;
  if (!a1) g.out_shape.push_back(g.m);
  if (!b1) g.out_shape.push_back(g.n);
  return g;
}

// Index of a per-row (rows = true) or per-column parameter: one value, one per row / column, or
// one per row / column of every matrix of the operand.
struct RowColIndex {
  int64_t size = 0, count = 0;  // count: rows or columns per matrix
  static Result<RowColIndex> make(const KernelContext& ctx, const Tensor* p, int64_t count, int64_t batches,
                                  std::string_view what) {
    RowColIndex r;
    r.count = count;
    if (!p) return r;
    r.size = p->numel();
    if (r.size == 1 || r.size == count || r.size == count * batches) return r;
    return ctx.error(std::string(what) + " has " + std::to_string(r.size) + " elements; expected 1, " +
                     std::to_string(count) + " or " + std::to_string(count * batches));
  }
  int64_t operator()(int64_t mat, int64_t i) const {
    if (size <= 1) return 0;
    return size == count ? i : mat * count + i;
  }
};

// The operands with their zero points subtracted, as int32: a per row, b per column.
std::vector<int32_t> shift_rows(const Tensor& t, const Tensor* zp, const RowColIndex& ix, int64_t mats, int64_t rows,
                                int64_t cols, bool per_row) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  for (int64_t mat = 0; mat < mats; ++mat)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        int64_t i = (mat * rows + r) * cols + c;
        int64_t z = zp ? zp->as_int64(ix(mat, per_row ? r : c)) : 0;
        out[static_cast<size_t>(i)] = static_cast<int32_t>(t.as_int64(i) - z);
      }
  return out;
}

// Shifted a @ shifted b in int32 for output batch entry t; acc is m*n.
void int_matmul(const std::vector<int32_t>& a, const std::vector<int32_t>& b, const MatmulGeom& g, int64_t t,
                std::vector<int32_t>& acc) {
  std::fill(acc.begin(), acc.end(), 0);
  const int32_t* am = a.data() + g.a_mat[static_cast<size_t>(t)] * g.m * g.k;
  const int32_t* bm = b.data() + g.b_mat[static_cast<size_t>(t)] * g.k * g.n;
  for (int64_t i = 0; i < g.m; ++i) {
    int32_t* row = acc.data() + i * g.n;
    for (int64_t kk = 0; kk < g.k; ++kk) {
      const int32_t av = am[i * g.k + kk];
      const int32_t* brow = bm + kk * g.n;
      for (int64_t j = 0; j < g.n; ++j) row[j] += av * brow[j];
    }
  }
}

Status ref_matmul_integer(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor* azp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* bzp = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  KILN_ASSIGN_OR_RETURN(MatmulGeom g, matmul_geom(ctx, a, b));
  KILN_ASSIGN_OR_RETURN(RowColIndex ar, RowColIndex::make(ctx, azp, g.m, g.a_batches, "a_zero_point"));
  KILN_ASSIGN_OR_RETURN(RowColIndex bc, RowColIndex::make(ctx, bzp, g.n, g.b_batches, "b_zero_point"));
  int32_t* y = ctx.output(0).data<int32_t>();
  std::vector<int32_t> as = shift_rows(a, azp, ar, g.a_batches, g.m, g.k, true);
  std::vector<int32_t> bs = shift_rows(b, bzp, bc, g.b_batches, g.k, g.n, false);
  std::vector<int32_t> acc(static_cast<size_t>(g.m * g.n));
  for (size_t t = 0; t < g.a_mat.size(); ++t) {
    int_matmul(as, bs, g, static_cast<int64_t>(t), acc);
    std::copy(acc.begin(), acc.end(), y + static_cast<int64_t>(t) * g.m * g.n);
  }
  return {};
}

// a_scale * b_scale / y_scale rounded like numpy does in the scales' type.
double requant_multiplier(DType t, double as, double bs, double ys) {
  auto r = [t](double v) -> double {
    if (t == DType::f16) return static_cast<float>(half(static_cast<float>(v)));
    if (t == DType::bf16) return static_cast<float>(bfloat16(static_cast<float>(v)));
    if (t == DType::f32) return static_cast<float>(v);
    return v;
  };
  return r(r(as * bs) / ys);
}

Status ref_qlinear_matmul(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& as = ctx.input(1);
  const Tensor& azp = ctx.input(2);
  const Tensor& b = ctx.input(3);
  const Tensor& bs = ctx.input(4);
  const Tensor& bzp = ctx.input(5);
  const Tensor& ys = ctx.input(6);
  const Tensor& yzp = ctx.input(7);
  KILN_ASSIGN_OR_RETURN(MatmulGeom g, matmul_geom(ctx, a, b));
  KILN_ASSIGN_OR_RETURN(RowColIndex ar, RowColIndex::make(ctx, &azp, g.m, g.a_batches, "a_zero_point"));
  KILN_ASSIGN_OR_RETURN(RowColIndex asr, RowColIndex::make(ctx, &as, g.m, g.a_batches, "a_scale"));
  KILN_ASSIGN_OR_RETURN(RowColIndex bc, RowColIndex::make(ctx, &bzp, g.n, g.b_batches, "b_zero_point"));
  KILN_ASSIGN_OR_RETURN(RowColIndex bsc, RowColIndex::make(ctx, &bs, g.n, g.b_batches, "b_scale"));
  if (ys.numel() != 1 || yzp.numel() != 1) return ctx.error("y_scale and y_zero_point must have one element");
  Tensor& y = ctx.output(0);
  const double yscale = ys.as_double(0);
  const int64_t yz = yzp.as_int64(0);
  std::vector<int32_t> a32 = shift_rows(a, &azp, ar, g.a_batches, g.m, g.k, true);
  std::vector<int32_t> b32 = shift_rows(b, &bzp, bc, g.b_batches, g.k, g.n, false);
  std::vector<int32_t> acc(static_cast<size_t>(g.m * g.n));
  return visit_dtype(y.dtype(), [&](auto tag) -> Status {
    using Q = decltype(tag);
    if constexpr (std::is_same_v<Q, uint8_t> || std::is_same_v<Q, int8_t>) {
      Q* out = y.data<Q>();
      for (size_t t = 0; t < g.a_mat.size(); ++t) {
        int_matmul(a32, b32, g, static_cast<int64_t>(t), acc);
        const int64_t am = g.a_mat[t], bm = g.b_mat[t];
        Q* o = out + static_cast<int64_t>(t) * g.m * g.n;
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < g.n; ++j) {
            double mult = requant_multiplier(as.dtype(), as.as_double(asr(am, i)), bs.as_double(bsc(bm, j)), yscale);
            o[i * g.n + j] = saturate_round<Q>(static_cast<double>(acc[static_cast<size_t>(i * g.n + j)]) * mult, yz);
          }
      }
      return {};
    } else {
      return ctx.error("output type must be u8 or i8");
    }
  });
}

// ---- convolution -------------------------------------------------------------------------

// Resolved geometry of an N-d convolution with concrete shapes.
struct ConvGeom {
  int64_t batch = 0, cin = 0, cout = 0, group = 1;
  std::vector<int64_t> in, kernel, out, stride, dil, pad;  // per spatial dim; pad = begin pads
};

Result<ConvGeom> conv_geom(const KernelContext& ctx, const Tensor& x, const Tensor& w) {
  const Node& n = ctx.node();
  ConvGeom g;
  if (x.rank() < 3 || w.rank() != x.rank())
    return ctx.error("input shape " + shape_str(x.shape()) + " and weight shape " + shape_str(w.shape()) +
                     " do not form a convolution");
  const size_t ns = static_cast<size_t>(x.rank() - 2);
  g.batch = x.dim(0);
  g.cin = x.dim(1);
  g.cout = w.dim(0);
  g.group = n.attr_int("group", 1);
  if (g.group < 1 || g.cin != w.dim(1) * g.group || g.cout % g.group != 0)
    return ctx.error("channels do not match: input " + shape_str(x.shape()) + ", weight " + shape_str(w.shape()) +
                     ", group " + std::to_string(g.group));
  g.stride = n.attr_ints("strides", std::vector<int64_t>(ns, 1));
  g.dil = n.attr_ints("dilations", std::vector<int64_t>(ns, 1));
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * ns, 0));
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  for (size_t i = 0; i < ns; ++i) {
    g.in.push_back(x.dim(static_cast<int64_t>(i) + 2));
    g.kernel.push_back(w.dim(static_cast<int64_t>(i) + 2));
    int64_t span = g.dil[i] * (g.kernel[i] - 1) + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t o = (g.in[i] + g.stride[i] - 1) / g.stride[i];
      int64_t total = std::max<int64_t>(0, (o - 1) * g.stride[i] + span - g.in[i]);
      g.pad.push_back(auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2);
      g.out.push_back(o);
    } else {
      int64_t pb = auto_pad == "VALID" ? 0 : pads[i], pe = auto_pad == "VALID" ? 0 : pads[i + ns];
      g.pad.push_back(pb);
      g.out.push_back((g.in[i] + pb + pe - span) / g.stride[i] + 1);
    }
  }
  return g;
}

// acc[b][m][o] = bias[m] + sum over the group's channels and the kernel window of
// (x - x_zp) * (w - w_zp[m]); padding contributes 0 (it pads the zero-point-shifted input).
Result<std::vector<int32_t>> int_conv(const KernelContext& ctx, const Tensor& x, const Tensor& w,
                                      const Tensor* xzp, const Tensor* wzp, const Tensor* bias, const ConvGeom& g) {
  if (xzp && xzp->numel() != 1) return ctx.error("x_zero_point must have one element");
  if (wzp && wzp->numel() != 1 && wzp->numel() != g.cout)
    return ctx.error("w_zero_point has " + std::to_string(wzp->numel()) + " elements; expected 1 or " + std::to_string(g.cout));
  if (bias && bias->numel() != g.cout)
    return ctx.error("bias has " + std::to_string(bias->numel()) + " elements but there are " + std::to_string(g.cout) + " output channels");
  const size_t ns = g.in.size();
  int64_t in_sp = 1, out_sp = 1, k_sp = 1;
  for (size_t i = 0; i < ns; ++i) { in_sp *= g.in[i]; out_sp *= g.out[i]; k_sp *= g.kernel[i]; }
  const int64_t cg = g.cin / g.group, mg = g.cout / g.group;
  const int32_t xz = xzp ? static_cast<int32_t>(xzp->as_int64(0)) : 0;
  std::vector<int32_t> acc(static_cast<size_t>(g.batch * g.cout * out_sp));
  // Kernel taps as per-dim offsets, so the inner loop is a bounds check and a multiply-add.
  std::vector<std::vector<int64_t>> taps(static_cast<size_t>(k_sp), std::vector<int64_t>(ns));
  for (int64_t t = 0; t < k_sp; ++t) {
    int64_t rem = t;
    for (size_t i = ns; i-- > 0;) { taps[static_cast<size_t>(t)][i] = rem % g.kernel[i] * g.dil[i]; rem /= g.kernel[i]; }
  }
  std::vector<int32_t> xs(static_cast<size_t>(cg * in_sp)), ws(static_cast<size_t>(cg * k_sp));
  std::vector<int64_t> oc(ns);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t m = 0; m < g.cout; ++m) {
      const int64_t grp = m / mg;
      const int32_t wz = !wzp ? 0 : static_cast<int32_t>(wzp->as_int64(wzp->numel() == 1 ? 0 : m));
      for (int64_t i = 0; i < cg * in_sp; ++i)
        xs[static_cast<size_t>(i)] = static_cast<int32_t>(x.as_int64((b * g.cin + grp * cg) * in_sp + i)) - xz;
      for (int64_t i = 0; i < cg * k_sp; ++i)
        ws[static_cast<size_t>(i)] = static_cast<int32_t>(w.as_int64(m * cg * k_sp + i)) - wz;
      int32_t* o = acc.data() + (b * g.cout + m) * out_sp;
      const int32_t bv = bias ? static_cast<int32_t>(bias->as_int64(m)) : 0;
      for (int64_t p = 0; p < out_sp; ++p) {
        int64_t rem = p;
        for (size_t i = ns; i-- > 0;) { oc[i] = rem % g.out[i] * g.stride[i] - g.pad[i]; rem /= g.out[i]; }
        int32_t sum = bv;
        for (int64_t t = 0; t < k_sp; ++t) {
          int64_t off = 0;
          bool inside = true;
          for (size_t i = 0; i < ns && inside; ++i) {
            int64_t c = oc[i] + taps[static_cast<size_t>(t)][i];
            inside = c >= 0 && c < g.in[i];
            off = off * g.in[i] + c;
          }
          if (!inside) continue;
          for (int64_t c = 0; c < cg; ++c) sum += xs[static_cast<size_t>(c * in_sp + off)] * ws[static_cast<size_t>(c * k_sp + t)];
        }
        o[p] = sum;
      }
    }
  return acc;
}

Status ref_conv_integer(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  KILN_ASSIGN_OR_RETURN(ConvGeom g, conv_geom(ctx, x, w));
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> acc,
                        int_conv(ctx, x, w, ctx.has_input(2) ? &ctx.input(2) : nullptr,
                                 ctx.has_input(3) ? &ctx.input(3) : nullptr, nullptr, g));
  Tensor& y = ctx.output(0);
  if (!acc.empty()) std::memcpy(y.raw(), acc.data(), acc.size() * sizeof(int32_t));
  return {};
}

Status ref_qlinear_conv(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& xs = ctx.input(1);
  const Tensor& w = ctx.input(3);
  const Tensor& ws = ctx.input(4);
  const Tensor& ys = ctx.input(6);
  const Tensor& yzp = ctx.input(7);
  KILN_ASSIGN_OR_RETURN(ConvGeom g, conv_geom(ctx, x, w));
  if (xs.numel() != 1 || ys.numel() != 1 || yzp.numel() != 1)
    return ctx.error("x_scale, y_scale and y_zero_point must have one element");
  if (ws.numel() != 1 && ws.numel() != g.cout)
    return ctx.error("w_scale has " + std::to_string(ws.numel()) + " elements; expected 1 or " + std::to_string(g.cout));
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> acc,
                        int_conv(ctx, x, w, &ctx.input(2), &ctx.input(5), ctx.has_input(8) ? &ctx.input(8) : nullptr, g));
  Tensor& y = ctx.output(0);
  const int64_t per_channel = g.cout == 0 ? 0 : static_cast<int64_t>(acc.size()) / std::max<int64_t>(g.batch * g.cout, 1);
  const int64_t yz = yzp.as_int64(0);
  return visit_dtype(y.dtype(), [&](auto tag) -> Status {
    using Q = decltype(tag);
    if constexpr (std::is_same_v<Q, uint8_t> || std::is_same_v<Q, int8_t>) {
      Q* out = y.data<Q>();
      for (int64_t bm = 0; bm < g.batch * g.cout; ++bm) {
        const int64_t m = bm % g.cout;
        const double mult = requant_multiplier(xs.dtype(), xs.as_double(0), ws.as_double(ws.numel() == 1 ? 0 : m), ys.as_double(0));
        for (int64_t p = 0; p < per_channel; ++p) {
          const int64_t i = bm * per_channel + p;
          out[i] = saturate_round<Q>(static_cast<double>(acc[static_cast<size_t>(i)]) * mult, yz);
        }
      }
      return {};
    } else {
      return ctx.error("output type must be u8 or i8");
    }
  });
}

}  // namespace

void register_ref_quant_integer(KernelRegistry& r) {
  r.add_reference("MatMulInteger", ref_matmul_integer);
  r.add_reference("QLinearMatMul", ref_qlinear_matmul);
  r.add_reference("ConvInteger", ref_conv_integer);
  r.add_reference("QLinearConv", ref_qlinear_conv);
}

}  // namespace kiln
