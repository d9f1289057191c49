// onednn.pool: MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool (1-D to 3-D) as a
// oneDNN pooling primitive on plain NC(D)HW tensors, or N(D)HWC ones with channels_last.
// ceil_mode becomes extra end padding (the window geometry of formats/ops/nn_util.h gives the
// output size); MaxPool's Indices output and average pooling that counts that extra padding
// stay with the reference kernels. Max pooling also runs on u8 / s8 tensors (a quantized
// model's, where a max commutes with the quantization) and on bf16 ones (a bf16 chain's, where
// it commutes with the rounding); kiln's own max pools take the channels-last 2-D ones of all
// those types (runtime/cpu/pool.cc).
#include <unordered_map>

#include "formats/ops/nn_util.h"
#include "runtime/onednn/onednn.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

bool global(const Node& n) { return n.op == "GlobalMaxPool" || n.op == "GlobalAveragePool"; }

std::optional<std::string> pool_declines(const KernelQuery& q) {
  const bool max = q.node.op == "MaxPool" || q.node.op == "GlobalMaxPool";
  if (max && (is_int8(q.inputs[0].dtype) || q.inputs[0].dtype == DType::bf16)) {
    if (!q.inputs[0].shape.is_concrete() || shape_numel(q.inputs[0].shape.concrete()) == 0) return "the input is empty or not concrete";
  } else if (auto why = f32_and_concrete(q)) {
    return why;
  }
  const int64_t rank = q.inputs[0].shape.rank();
  if (rank < 3 || rank > 5) return "only 1-D to 3-D pooling";
  if (q.outputs.size() > 1 && q.outputs[1].dtype != DType::undefined) return "the Indices output";
  if (q.node.op == "AveragePool" && q.node.attr_int("ceil_mode", 0) && q.node.attr_int("count_include_pad", 0))
    return "ceil_mode with count_include_pad";
  return std::nullopt;
}

class PoolKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    return guarded(q.node, [&]() -> Status {
      const bool last = nn::channels_last(q.node);
      std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
      if (last) {  // oneDNN's dims are logical [N, C, spatial...] whatever the layout
        xs = nn::permute(xs, nn::channels_first_perm(xs.size()));
        ys = nn::permute(ys, nn::channels_first_perm(ys.size()));
      }
      const std::vector<int64_t> spatial(xs.begin() + 2, xs.end()), out(ys.begin() + 2, ys.end());
      const size_t n = spatial.size();
      memory::dims kernel(n), strides(n, 1), dil(n, 0), pad_l(n, 0), pad_r(n, 0);
      if (global(q.node)) {
        for (size_t i = 0; i < n; ++i) kernel[i] = spatial[i];
      } else {
        KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, spatial, {}, q.node.attr_int("ceil_mode", 0) != 0));
        for (size_t i = 0; i < n; ++i) {
          kernel[i] = w.kernel[i];
          strides[i] = w.strides[i];
          dil[i] = w.dilations[i] - 1;
          pad_l[i] = w.pads[i];
          // The end padding that makes oneDNN's output size the one inference gave (ceil_mode).
          pad_r[i] = (out[i] - 1) * w.strides[i] + (w.kernel[i] - 1) * w.dilations[i] + 1 - spatial[i] - w.pads[i];
        }
      }
      const bool max = q.node.op == "MaxPool" || q.node.op == "GlobalMaxPool";
      const dnnl::algorithm alg = max ? dnnl::algorithm::pooling_max
                                  : q.node.attr_int("count_include_pad", 0) ? dnnl::algorithm::pooling_avg_include_padding
                                                                            : dnnl::algorithm::pooling_avg_exclude_padding;
      const memory::data_type t = q.inputs[0].dtype == DType::u8     ? memory::data_type::u8
                                  : q.inputs[0].dtype == DType::i8   ? memory::data_type::s8
                                  : q.inputs[0].dtype == DType::bf16 ? memory::data_type::bf16
                                                                     : memory::data_type::f32;
      const memory::desc src = last ? channels_last(xs, t) : plain(xs, t), dst = last ? channels_last(ys, t) : plain(ys, t);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src, dst, strides, kernel, dil, pad_l, pad_r);
      foreign_ = false;
      auto pd = primitive_for(q.target, [&] { return dnnl::pooling_v2_forward::primitive_desc(desc, attr, cpu_engine()); });
      if (!pd) {  // a bf16 pool compiled for --target amx on a CPU without AVX512-BF16
        foreign_ = true;
        return {};
      }
      prim_ = dnnl::pooling_v2_forward(*pd);
      src_ = memory(src, cpu_engine(), nullptr);
      dst_ = memory(dst, cpu_engine(), nullptr);
      scratch_ = memory(pd->scratchpad_desc(), cpu_engine(), nullptr);
      needs.workspace_bytes = pd->scratchpad_desc().get_size();
      return {};
    });
  }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      if (foreign_) return unprepared(ctx);
      src_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      dst_.set_data_handle(ctx.output(0).raw());
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}};
      execute(prim_, args, scratch_, ctx.workspace());
      return {};
    });
  }

 private:
  dnnl::pooling_v2_forward prim_;
  memory src_, dst_, scratch_;
  bool foreign_ = false;  ///< compiled for a CPU oneDNN has no primitive for here (primitive_for)
};

}  // namespace

void register_pool(KernelRegistry& r) {
  for (const char* op : {"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})
    r.add(op, "cpu", KernelImpl{"onednn.pool", pool_declines, [](const KernelQuery&) { return std::make_unique<PoolKernel>(); }});
}

}  // namespace kiln::onednn
