// xnnpack.fully_connected: small MatMul / FusedMatMul / Gemm with a constant 2-D weight, on
// Debian's XNNPACK. kiln_bench_xnnpack_vs_onednn measured XNNPACK against oneDNN on the models'
// shapes, one thread: oneDNN wins or ties every convolution (depthwise included) and every
// linear layer from 64x64x64 up (by up to 2x), XNNPACK wins only the tiny layers where a call's
// fixed cost is the time (1x16 @ 16x64: 0.1 us against oneDNN's 0.4 us). So the default rule
// gives it only those (M·K·N up to kMaxWork, `defers`); max-autotune times it up to kMaxTuned.
// It runs on the calling thread: XNNPACK's own thread pool would be a second pool next to GNU
// OpenMP's, and work this small is not worth sharing.
//
// The weight is packed once in prepare (xnn_create_fully_connected_nc_f32); the bias and a
// Relu / Clip run in XNNPACK as its bias and output clamp; any other epilogue (activation,
// residual Z) runs after it on kiln's row kernels.
#include <xnnpack.h>

#include <cmath>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::xnnpack {

namespace {

constexpr int64_t kMaxWork = 1 << 15;  // M·K·N the default rule gives it
// M·K·N max-autotune times it up to: on one thread, a product of a million multiply-adds takes
// ~0.1 ms, where the fixed cost of a call that XNNPACK saves is a fraction of a microsecond.
constexpr int64_t kMaxTuned = 1 << 20;

bool initialized() {
  static const bool ok = xnn_initialize(nullptr) == xnn_status_success;
  return ok;
}

struct Shape2 {
  int64_t m = 0, k = 0, n = 0;
};

// The product as [M, K] · [K, N]: A's leading dims fold into M (MatMul, FusedMatMul); Gemm
// without transA. The weight is input 1, constant, 2-D.
std::optional<Shape2> shape_of(const KernelQuery& q) {
  const std::vector<int64_t> a = q.inputs[0].shape.concrete(), b = q.inputs[1].shape.concrete();
  const bool tb = q.node.op == "Gemm" && q.node.attr_int("transB", 0) != 0;
  Shape2 s;
  s.k = a.back();
  s.n = tb ? b[0] : b[1];
  s.m = 1;
  for (size_t i = 0; i + 1 < a.size(); ++i) s.m *= a[i];
  return s;
}

std::optional<std::string> declines(const KernelQuery& q) {
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && (in.dtype != DType::f32 || !in.shape.is_concrete())) return "not f32 of known shape";
  if (q.outputs[0].dtype != DType::f32 || !q.outputs[0].shape.is_concrete()) return "not f32 of known shape";
  if (q.outputs.size() > 1) return "split outputs";
  if (q.node.has_attr("gate_block")) return "a gated product";
  if (q.inputs[0].shape.rank() < 2 || q.inputs[1].shape.rank() != 2) return "not [.., M, K] by a 2-D weight";
  if (!q.inputs[1].value) return "the weight is computed at run time";
  if (q.node.op == "Gemm") {
    if (q.node.attr_int("transA", 0) != 0 || q.node.attr_float("alpha", 1.0) != 1.0) return "transA or alpha";
    if (q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined) {
      const std::vector<int64_t> c = q.inputs[2].shape.concrete();
      const int64_t n = q.outputs[0].shape.concrete().back();
      if (q.node.attr_float("beta", 1.0) != 1.0 || !((c.size() == 1 && c[0] == n) || (c.size() == 2 && c[0] == 1 && c[1] == n)))
        return "C is not a row of N values added once";
    }
  }
  const bool bias = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
  if (bias && !q.inputs[2].value) return "the bias is computed at run time";
  const Shape2 s = *shape_of(q);
  if (s.m * s.k * s.n > kMaxTuned) return "larger than a million multiply-adds (it runs on one thread)";
  if (s.m * s.k * s.n == 0) return "empty";
  if (q.node.op == "FusedMatMul" && !cpu::best_isa(q.target.cpu)) return "the epilogue needs AVX2 or AVX-512";
  if (!initialized()) return "XNNPACK does not support this CPU";
  return std::nullopt;
}

std::optional<std::string> defers(const KernelQuery& q) {
  const Shape2 s = *shape_of(q);
  if (s.m * s.k * s.n > kMaxWork) return "larger than 32768 multiply-adds (oneDNN is faster there)";
  return std::nullopt;
}

class FullyConnected final : public Kernel {
 public:
  ~FullyConnected() override {
    if (op_) xnn_delete_operator(op_);
  }

  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    shape_ = *shape_of(q);
    const bool tb = q.node.op == "Gemm" && q.node.attr_int("transB", 0) != 0;
    const float* bias = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined ? q.inputs[2].value->data<float>() : nullptr;
    float lo = -INFINITY, hi = INFINITY;
    if (q.node.op == "FusedMatMul") {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
      has_z_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
      // A Relu or Clip with nothing after it is XNNPACK's output clamp.
      if (!has_z_ && post_.kind == Activation::none && (act_.kind == Activation::relu || act_.kind == Activation::clip)) {
        lo = act_.kind == Activation::relu ? 0.f : act_.a;
        hi = act_.kind == Activation::relu ? INFINITY : act_.b;
        act_ = {};
      }
      if (act_.kind != Activation::none || post_.kind != Activation::none || has_z_) rows_ = &cpu::row_kernels(*cpu::best_isa(q.target.cpu));
    }
    // XNNPACK copies (packs) the weight and bias here; [N, K] as Gemm's transB has it, else [K, N].
    const xnn_status st = xnn_create_fully_connected_nc_f32(static_cast<size_t>(shape_.k), static_cast<size_t>(shape_.n),
                                                             static_cast<size_t>(shape_.k), static_cast<size_t>(shape_.n),
                                                             q.inputs[1].value->data<float>(), bias, lo, hi,
                                                             tb ? 0 : XNN_FLAG_TRANSPOSE_WEIGHTS, &op_);
    if (st != xnn_status_success) return internal_error(q.node.where(), "XNNPACK: creating the fully-connected operator failed (" + std::to_string(st) + ")");
    return {};
  }

  Status run(KernelContext& ctx) override {
    Tensor& y = ctx.output(0);
    const float* x = ctx.input(0).data<float>();
    // XNNPACK's setup binds the pointers: again only when they moved (a new input buffer).
    if (x != bound_x_ || y.data<float>() != bound_y_) {
      if (xnn_setup_fully_connected_nc_f32(op_, static_cast<size_t>(shape_.m), x, y.data<float>(), nullptr) != xnn_status_success)
        return internal_error(ctx.node().where(), "XNNPACK: binding the fully-connected operator failed");
      bound_x_ = x;
      bound_y_ = y.data<float>();
    }
    if (xnn_run_operator(op_, nullptr) != xnn_status_success)
      return internal_error(ctx.node().where(), "XNNPACK: running the fully-connected operator failed");
    if (rows_) rows_->epilogue(y.data<float>(), has_z_ ? ctx.input(3).data<float>() : nullptr, y.numel(), act_, post_);
    return {};
  }

 private:
  Shape2 shape_;
  xnn_operator_t op_ = nullptr;
  const float* bound_x_ = nullptr;
  const float* bound_y_ = nullptr;
  const cpu::RowKernels* rows_ = nullptr;  ///< set when kiln applies (the rest of) the epilogue
  ActivationSpec act_, post_;
  bool has_z_ = false;
};

}  // namespace

}  // namespace kiln::xnnpack

namespace kiln {

void register_xnnpack_kernels(KernelRegistry& r) {
  for (const char* op : {"MatMul", "FusedMatMul", "Gemm"})
    r.add(op, "cpu", KernelImpl{.name = "xnnpack.fully_connected",
                                .declines = xnnpack::declines,
                                .create = [](const KernelQuery&) { return std::make_unique<xnnpack::FullyConnected>(); },
                                .defers = xnnpack::defers});
}

}  // namespace kiln
