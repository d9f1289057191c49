// kiln.quantize_<isa> / kiln.dequantize_<isa>: per-tensor QuantizeLinear (f32 -> u8 / s8) and
// DequantizeLinear (u8 / s8 -> f32) with constant scale and zero point, on the row kernels of
// the target's ISA: where a quantized model's int8 region starts and ends (the reference kernels
// work in double per element, 40 times slower); kiln.dynamic_quantize_<isa>:
// DynamicQuantizeLinear (a dynamically quantized linear layer's input). Bit-exact with the
// reference. kiln.qadd_<isa>: QAdd (a quantized residual add); kiln.qmul_<isa>: QMul (a
// quantized tensor times f32 factors: a squeeze-excite block's channel gate);
// kiln.lookup_table_<isa>: LookupTable (f(DQ(x)) of an elementwise f, one value per code).
#include <algorithm>
#include <cmath>

#include "runtime/cpu/quant.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {


// Runs f(begin, end) over [0, n) in pieces of kPiece elements, shared among the pool's threads
// when there are enough of them (64 Ki elements: shared at two threads, BERT-base's 128x768
// activations took 0.56-0.63 ms a run to dequantize, 37 nodes, against 0.88-1.09 on one
// thread, and 0.25-0.34 against 0.41-0.45 to quantize, 14; int8 BERT-base at sequence 128).
constexpr int64_t kPiece = 16384, kParallelElements = 1 << 16;
template <class F>
void over_pieces(int64_t n, F&& f, int64_t parallel_from = kParallelElements) {
  if (n < parallel_from) {
    f(0, n);
    return;
  }
  const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pieces; ++p) f(p * kPiece, std::min(n, (p + 1) * kPiece));
}

std::optional<std::string> qdq_declines(const KernelQuery& q, Isa isa, bool quantize) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.inputs.size() != 3 || q.inputs[2].dtype == DType::undefined) return "no zero point";
  const DType data = q.inputs[0].dtype, out = q.outputs[0].dtype;
  if (quantize ? data != DType::f32 || !is_int8(out) : !is_int8(data) || out != DType::f32) return "not f32 <-> u8 / s8";
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
    scale_ = constant_scalar(q.inputs[1]);
    zero_ = constant_zero_point(q.inputs[2]);
    u8_ = q.inputs[2].dtype == DType::u8;
    return {};
  }
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0);
    over_pieces(x.numel(), [&](int64_t b, int64_t e) {
      if (quantize_) rows_.quantize(x.data<float>() + b, static_cast<std::byte*>(y.raw()) + b, e - b, scale_, zero_, u8_);
      else rows_.dequantize(static_cast<const std::byte*>(x.raw()) + b, y.data<float>() + b, e - b, scale_, zero_, u8_);
    });
    return {};
  }

 private:
  const RowKernels& rows_;
  bool quantize_;
  float scale_ = 1;
  int32_t zero_ = 0;
  bool u8_ = true;
};

// DynamicQuantizeLinear: the range in one pass, then the quantization of the other kernels, with
// the reference's scale and zero point arithmetic (f32) exactly.
class DynamicQuantizeKernel final : public Kernel {
 public:
  explicit DynamicQuantizeKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    float lo = 0, hi = 0;
    if (rows_.range(x.data<float>(), x.numel(), &lo, &hi)) {
      const float* v = x.data<float>();
      int64_t i = 0;
      while (i < x.numel() && !std::isnan(v[i])) ++i;
      return ctx.error("input contains NaN at element " + std::to_string(i));
    }
    const float scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
    const float zp = std::nearbyint(std::max(0.0f, std::min(255.0f, 0.0f - lo / scale)));
    rows_.quantize(x.data<float>(), ctx.output(0).raw(), x.numel(), scale, static_cast<int32_t>(zp), true);
    ctx.output(1).data<float>()[0] = scale;
    ctx.output(2).data<uint8_t>()[0] = static_cast<uint8_t>(zp);
    return {};
  }

 private:
  const RowKernels& rows_;
};

// QAdd of two tensors of one shape in one pass (RowKernels::qadd): the scales folded into two
// multipliers and a constant at plan time, so each element costs two multiply-adds, a rounding
// and the saturation; within one step of the reference's divide-then-round.
class QAddKernel final : public Kernel {
 public:
  explicit QAddKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    auto scalar = [&](size_t i) { return constant_scalar(q.inputs[i]); };
    const float sa = scalar(1), za = scalar(2), sb = scalar(4), zb = scalar(5), sy = scalar(6);
    ka_ = sa / sy;
    kb_ = sb / sy;
    c_ = -(za * sa + zb * sb) / sy;
    zy_ = scalar(7);
    a_u8_ = q.inputs[0].dtype == DType::u8;
    b_u8_ = q.inputs[3].dtype == DType::u8;
    y_u8_ = q.outputs[0].dtype == DType::u8;
    KILN_ASSIGN_OR_RETURN(ActivationSpec act, read_activation(q.node, "activation"));
    relu_ = act.kind == Activation::relu;
    return {};
  }
  Status run(KernelContext& ctx) override {
    const auto* a = static_cast<const std::byte*>(ctx.input(0).raw());
    const auto* b = static_cast<const std::byte*>(ctx.input(3).raw());
    auto* y = static_cast<std::byte*>(ctx.output(0).raw());
    over_pieces(ctx.output(0).numel(), [&](int64_t from, int64_t to) {
      rows_.qadd(a + from, a_u8_, b + from, b_u8_, y + from, y_u8_, to - from, ka_, kb_, c_, zy_, relu_);
    });
    return {};
  }

 private:
  const RowKernels& rows_;
  float ka_ = 1, kb_ = 1, c_ = 0, zy_ = 0;
  bool a_u8_ = true, b_u8_ = true, y_u8_ = true, relu_ = false;
};

std::optional<std::string> qadd_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  for (size_t i : {size_t{1}, size_t{2}, size_t{4}, size_t{5}, size_t{6}, size_t{7}})
    if (!q.inputs[i].value || q.inputs[i].value->numel() != 1) return "the scales and zero points are not constant scalars";
  if (!q.inputs[0].shape.is_concrete() || q.inputs[0].shape != q.inputs[3].shape || q.inputs[0].shape != q.outputs[0].shape)
    return "a and b differ in shape (broadcasting)";
  auto act = read_activation(q.node, "activation");
  if (!act.ok() || (act->kind != Activation::none && act->kind != Activation::relu)) return "an activation other than Relu";
  return std::nullopt;
}

// Codes from which QMul's and LookupTable's threads share the work (a byte in each, a quarter
// of the quantization's bytes; at 64 Ki, QMul's smaller tensors ran slower on two threads), and
// the factors QMul makes at a time for b of a's shape.
constexpr int64_t kParallelCodes = 1 << 17, kStretch = 1024;

// QMul in one pass (RowKernels::qscale): each value a's code times a factor plus an offset,
// requantized, where factor = b · a's scale / y's scale and offset = −a's zero point · factor
// (a NaN factor 0: the product quantizes to the zero point, as the reference's NaN does). A
// channel gate's factors and offsets are made once per image, each run (c values, in the
// workspace); b of a's shape has its own made kStretch at a time on the thread's stack. The
// rows are shared among the threads in pieces.
class QMulKernel final : public Kernel {
 public:
  explicit QMulKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    shape_ = *qmul_shape(q.inputs[0].shape, q.inputs[3].shape);
    k_ = constant_scalar(q.inputs[1]) / constant_scalar(q.inputs[4]);
    za_ = constant_scalar(q.inputs[2]);
    zy_ = constant_scalar(q.inputs[5]);
    a_u8_ = q.inputs[0].dtype == DType::u8;
    y_u8_ = q.outputs[0].dtype == DType::u8;
    if (shape_.gate) needs.workspace_bytes = static_cast<size_t>(2 * shape_.images * shape_.c) * sizeof(float);
    return {};
  }
  Status run(KernelContext& ctx) override {
    const auto* a = static_cast<const std::byte*>(ctx.input(0).raw());
    const float* b = ctx.input(3).data<float>();
    auto* y = static_cast<std::byte*>(ctx.output(0).raw());
    float* work = reinterpret_cast<float*>(ctx.workspace().data());
    auto factors = [&](const float* from, int64_t n, float* m, float* o) {
      for (int64_t j = 0; j < n; ++j) {
        const float f = from[j] * k_;
        m[j] = f == f ? f : 0.f;
        o[j] = -za_ * m[j];
      }
    };
    if (!shape_.gate) {
      over_pieces(shape_.c, [&](int64_t from, int64_t to) {
        float m[kStretch], o[kStretch];  // a stretch's factors and offsets, in L1
        for (int64_t p = from; p < to; p += kStretch) {
          const int64_t n = std::min(kStretch, to - p);
          factors(b + p, n, m, o);
          rows_.qscale(a + p, a_u8_, m, o, 0, y + p, y_u8_, 1, n, zy_);
        }
      }, kParallelCodes);
      return {};
    }
    const int64_t c = shape_.c, per = shape_.rows;
    factors(b, shape_.images * c, work, work + shape_.images * c);
    const float* o = work + shape_.images * c;
    // A piece [from, to) of the values takes the rows that start in it.
    over_pieces(shape_.images * per * c, [&](int64_t from, int64_t to) {
      for (int64_t r = (from + c - 1) / c, r1 = (to + c - 1) / c; r < r1;) {
        const int64_t image = r / per, end = std::min(r1, (image + 1) * per);
        rows_.qscale(a + r * c, a_u8_, work + image * c, o + image * c, 0, y + r * c, y_u8_, end - r, c, zy_);
        r = end;
      }
    }, kParallelCodes);
    return {};
  }

 private:
  const RowKernels& rows_;
  QMulShape shape_;
  float k_ = 1, za_ = 0, zy_ = 0;
  bool a_u8_ = true, y_u8_ = true;
};

// LookupTable on the row kernels (RowKernels::lookup), shared among the threads in pieces.
class LookupTableKernel final : public Kernel {
 public:
  explicit LookupTableKernel(Isa isa) : rows_(row_kernels(isa)) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    s8_ = q.inputs[0].dtype == DType::i8;
    return {};
  }
  Status run(KernelContext& ctx) override {
    const auto* x = static_cast<const std::byte*>(ctx.input(0).raw());
    const float* table = ctx.input(1).data<float>();
    float* y = ctx.output(0).data<float>();
    over_pieces(ctx.input(0).numel(), [&](int64_t from, int64_t to) { rows_.lookup(x + from, s8_, table, y + from, to - from); },
                kParallelCodes);
    return {};
  }

 private:
  const RowKernels& rows_;
  bool s8_ = false;
};

std::optional<std::string> qmul_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  for (size_t i : {size_t{1}, size_t{2}, size_t{4}, size_t{5}})
    if (!q.inputs[i].value || q.inputs[i].value->numel() != 1) return "the scales and zero points are not constant scalars";
  if (q.inputs[0].shape != q.outputs[0].shape) return "b broadcasts a";
  if (!qmul_shape(q.inputs[0].shape, q.inputs[3].shape)) return "b is neither of a's shape nor a channel gate [N or 1, 1.., C]";
  return std::nullopt;
}

}  // namespace

std::optional<QMulShape> qmul_shape(const Shape& a, const Shape& b) {
  if (!a.is_concrete() || !b.is_concrete() || a.rank() < 1 || b.rank() > a.rank()) return std::nullopt;
  const std::vector<int64_t> as = a.concrete(), bs = b.concrete();
  const int64_t numel = shape_numel(as);
  if (as == bs) return QMulShape{1, 1, numel, false};
  const size_t r = as.size(), lead = r - bs.size();
  if (r < 2 || bs.empty() || bs.back() != as.back() || numel == 0) return std::nullopt;
  for (size_t d = 0; d + 1 < bs.size(); ++d)
    if (bs[d] != 1 && !(d + lead == 0 && bs[d] == as[0])) return std::nullopt;
  const int64_t images = lead == 0 ? bs[0] : 1;
  return QMulShape{images, numel / (images * as.back()), as.back(), true};
}

void register_quant(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("QAdd", "cpu",
          KernelImpl{std::string("kiln.qadd_") + isa_name(isa), [isa](const KernelQuery& q) { return qadd_declines(q, isa); },
                     [isa](const KernelQuery&) { return std::make_unique<QAddKernel>(isa); }, isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("QMul", "cpu",
          KernelImpl{std::string("kiln.qmul_") + isa_name(isa), [isa](const KernelQuery& q) { return qmul_declines(q, isa); },
                     [isa](const KernelQuery&) { return std::make_unique<QMulKernel>(isa); }, isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("LookupTable", "cpu",
          KernelImpl{std::string("kiln.lookup_table_") + isa_name(isa),
                     [isa](const KernelQuery& q) -> std::optional<std::string> {
                       if (auto why = lacks(q.target.cpu, isa)) return why;
                       if (!q.inputs[1].shape.is_concrete() || q.inputs[1].shape.concrete() != std::vector<int64_t>{256})
                         return "not a table of 256";
                       return std::nullopt;
                     },
                     [isa](const KernelQuery&) { return std::make_unique<LookupTableKernel>(isa); }, isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("DynamicQuantizeLinear", "cpu",
          KernelImpl{std::string("kiln.dynamic_quantize_") + isa_name(isa),
                     [isa](const KernelQuery& q) -> std::optional<std::string> {
                       if (auto why = lacks(q.target.cpu, isa)) return why;
                       if (q.inputs[0].dtype != DType::f32) return "not f32";
                       return std::nullopt;
                     },
                     [isa](const KernelQuery&) { return std::make_unique<DynamicQuantizeKernel>(isa); }, isa_features(isa)});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (bool quantize : {true, false})
      r.add(quantize ? "QuantizeLinear" : "DequantizeLinear", "cpu",
            KernelImpl{std::string(quantize ? "kiln.quantize_" : "kiln.dequantize_") + isa_name(isa),
                       [isa, quantize](const KernelQuery& q) { return qdq_declines(q, isa, quantize); },
                       [isa, quantize](const KernelQuery&) { return std::make_unique<QdqKernel>(isa, quantize); },
                       isa_features(isa)});
}

}  // namespace kiln::cpu
