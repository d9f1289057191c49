// onednn.matmul: MatMul, FusedMatMul and Gemm as a oneDNN matmul. A product whose B has no
// batch (a linear layer's weight) is one tall GEMM over all of A's rows; otherwise the batch
// dims broadcast as numpy does. A constant B is reordered once in prepare into the layout
// oneDNN picks (or used in place when a compiled model stored it packed that way); Gemm's transposed operands are read in place through strides; the fused
// epilogue (bias, activation, residual Z) runs as bias and post-ops (the residual as a sum
// post-op over a copy of Z in the destination).
// A FusedMatMul whose constant B `kiln compile --precision bf16` stored as bf16 runs as oneDNN's
// bf16 matmul (AMX tiles where the CPU has them): A reordered to bf16 in the workspace, the
// products summed in f32, Y and the epilogue f32; B stored packed in bf16.
#include <optional>
#include <unordered_map>

#include "runtime/onednn/onednn.h"
#include "runtime/threads.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

int64_t product(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= v[i];
  return p;
}

std::optional<std::string> matmul_declines(const KernelQuery& q) {
  if (auto why = f32_and_concrete(q, q.node.op == "FusedMatMul" ? TypeSet(DType::bf16) : TypeSet())) return why;
  if (q.inputs[0].shape.rank() < 2 || q.inputs[1].shape.rank() < 2) return "1-D operands";
  if (q.outputs.size() > 1) return "split outputs";
  if (q.node.has_attr("gate_block")) return "a gated product";
  if (q.node.op == "Gemm") return gemm_form_declines(q);
  return std::nullopt;
}

class MatMulKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    return guarded(q.node, [&]() -> Status {
      const bool gemm = q.node.op == "Gemm", fused = q.node.op == "FusedMatMul";
      std::vector<int64_t> a = q.inputs[0].shape.concrete(), b = q.inputs[1].shape.concrete();
      const std::vector<int64_t> y = q.outputs[0].shape.concrete();
      const bool ta = gemm && q.node.attr_int("transA", 0) != 0, tb = gemm && q.node.attr_int("transB", 0) != 0;
      const size_t rank = y.size();
      // B without a batch: fold A's batch into M.
      const bool b_flat = product(b, 0, b.size() - 2) == 1;
      std::vector<int64_t> ad, bd, yd;
      if (b_flat && !ta) {
        const int64_t m = product(a, 0, a.size() - 1);
        ad = {m, a.back()};
        bd = {b[b.size() - 2], b.back()};
        yd = {m, y.back()};
      } else {
        ad = a;
        bd = b;
        ad.insert(ad.begin(), rank - ad.size(), 1);
        bd.insert(bd.begin(), rank - bd.size(), 1);
        yd = y;
      }
      // Logical dims are [.., M, K] and [.., K, N]; a transposed operand is stored the other way.
      auto logical = [](std::vector<int64_t> d, bool t) {
        if (t) std::swap(d[d.size() - 1], d[d.size() - 2]);
        return d;
      };
      const memory::desc src = ta ? transposed(logical(ad, true)) : plain(ad);
      const std::vector<int64_t> bl = logical(bd, tb);
      // A bf16 B (always constant, FusedMatMul's): the product reads A as bf16 too.
      const bool bf16 = q.inputs[1].dtype == DType::bf16;
      const memory::data_type wtype = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
      const memory::desc user_w = tb ? transposed(bl) : plain(bl, wtype), dst = plain(yd);
      const memory::desc src_bf16 = bf16 ? plain(ad, wtype) : memory::desc();
      const bool const_b = q.inputs[1].value != nullptr;
      const memory::desc w = const_b ? memory::desc(memory::dims(bl.begin(), bl.end()), wtype, memory::format_tag::any) : user_w;
      // The bias: FusedMatMul's [N], or Gemm's C when it is one row.
      memory::desc bias;
      std::optional<memory::desc> z_md;
      has_bias_ = false;
      if (q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined) {
        const std::vector<int64_t> c = q.inputs[2].shape.concrete();
        if (fused || c.size() == 1 || c[0] == 1) {
          std::vector<int64_t> bdims(yd.size(), 1);
          bdims.back() = yd.back();
          bias = plain(bdims);
          has_bias_ = true;
        } else {
          z_md = dst;  // Gemm's full [M, N] C: added like a residual
          z_input_ = 2;
        }
      }
      if (fused && q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined) {
        z_md = dst;
        z_input_ = 3;
      }
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (fused) {
        KILN_ASSIGN_OR_RETURN(dnnl::post_ops ops, epilogue_post_ops(q.node, z_md ? &*z_md : nullptr, z_index_));
        attr.set_post_ops(ops);
      } else if (z_md) {
        dnnl::post_ops ops;
        z_index_ = 0;
        ops.append_sum(1.f);  // C, copied into the destination before executing
        attr.set_post_ops(ops);
      }
      dnnl::matmul::desc desc(bf16 ? src_bf16 : src, w, bias, dst);
      dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
      if (const_b) {
        KILN_ASSIGN_OR_RETURN(PrepackedWeights w, prepack_weights(q, *q.inputs[1].value, user_w, pd.weights_desc(), tb, "matmul"));
        weights_ = std::move(w.weights);
        packed_ = std::move(w.packed);
      } else {
        weights_ = memory(user_w, cpu_engine(), nullptr);
      }
      const_b_ = const_b;
      prim_ = dnnl::matmul(pd);
      src_ = memory(src, cpu_engine(), nullptr);
      dst_ = memory(dst, cpu_engine(), nullptr);
      if (has_bias_) bias_ = memory(bias, cpu_engine(), nullptr);
      scratch_ = memory(pd.scratchpad_desc(), cpu_engine(), nullptr);
      needs.workspace_bytes = pd.scratchpad_desc().get_size();
      src_offset_.reset();
      if (bf16) {  // A in bf16 after the scratchpad
        src_offset_ = (needs.workspace_bytes + 63) / 64 * 64;
        src_in_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src, cpu_engine(), src_bf16));
        lowp_src_ = memory(src_bf16, cpu_engine(), nullptr);
        needs.workspace_bytes = *src_offset_ + src_bf16.get_size();
      }
      return {};
    });
  }

  Tensor packed_input(size_t input) const override { return input == 1 ? packed_ : Tensor(); }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      src_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      if (!const_b_) weights_.set_data_handle(const_cast<void*>(ctx.input(1).raw()));
      dst_.set_data_handle(ctx.output(0).raw());
      memory src = src_;
      if (src_offset_) {
        lowp_src_.set_data_handle(ctx.workspace().data() + *src_offset_);
        src_in_.execute(cpu_stream(), src_, lowp_src_);
        src = lowp_src_;
      }
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}};
      if (has_bias_) {
        bias_.set_data_handle(const_cast<void*>(ctx.input(2).raw()));
        args.emplace(DNNL_ARG_BIAS, bias_);
      }
      if (z_index_ >= 0) {
        // The residual, added by the sum post-op.
        const Tensor& z = ctx.input(z_input_);
        if (ctx.output(0).raw() != z.raw()) parallel_copy(ctx.output(0).raw(), z.raw(), z.nbytes());  // unless Y is Z
      }
      execute(prim_, args, scratch_, ctx.workspace());
      return {};
    });
  }

  // The sum post-op adds to the destination: Y may be the residual's (or Gemm's C's) memory.
  int overwrites_input() const override { return z_index_ >= 0 ? static_cast<int>(z_input_) : -1; }

 private:
  dnnl::matmul prim_;
  Tensor packed_;  // the constant B as weights_ holds it, for a compiled model
  dnnl::reorder src_in_;  // A to bf16, for a bf16 B
  memory weights_, src_, dst_, bias_, scratch_, lowp_src_;
  /// A's bf16 copy in the workspace (after the scratchpad, which may be empty: 0 is an offset);
  /// none: A is read as it is.
  std::optional<size_t> src_offset_;
  bool has_bias_ = false, const_b_ = false;
  int z_index_ = -1;
  size_t z_input_ = 0;
};

}  // namespace

void register_matmul(KernelRegistry& r) {
  for (const char* op : {"MatMul", "FusedMatMul", "Gemm"})
    r.add(op, "cpu", KernelImpl{.name = "onednn.matmul",
                                .declines = matmul_declines,
                                .create = [](const KernelQuery&) { return std::make_unique<MatMulKernel>(); },
                                .reads_packed = true});
}

}  // namespace kiln::onednn
