// onednn.conv: Conv and FusedConv (1-D to 3-D, grouped and depthwise) as a oneDNN forward
// convolution. The weights must be constant: prepare reorders them once into the blocked
// layout oneDNN picks for the shapes and ISA; the fused epilogue runs as post-ops. Inputs and
// outputs stay in kiln's plain NC(D)HW layout.
#include <unordered_map>

#include "formats/ops/nn_util.h"
#include "runtime/onednn/onednn.h"

namespace kiln::onednn {

namespace {

using dnnl::memory;

std::optional<std::string> conv_declines(const KernelQuery& q) {
  if (auto why = f32_and_concrete(q)) return why;
  const int64_t rank = q.inputs[0].shape.rank();
  if (rank < 3 || rank > 5) return "only 1-D to 3-D convolutions";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  return std::nullopt;
}

class ConvKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    return guarded(q.node, [&]() -> Status {
      const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[1].shape.concrete();
      const std::vector<int64_t> ys = q.outputs[0].shape.concrete();
      const int64_t group = q.node.attr_int("group", 1);
      std::vector<int64_t> spatial(xs.begin() + 2, xs.end()), kernel(ws.begin() + 2, ws.end());
      KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, spatial, kernel, false));
      const size_t n = spatial.size();
      memory::dims strides(w.strides.begin(), w.strides.end()), dil(n), pad_l(n), pad_r(n);
      for (size_t i = 0; i < n; ++i) {
        dil[i] = w.dilations[i] - 1;  // oneDNN counts the gaps
        pad_l[i] = w.pads[i];
        pad_r[i] = w.pads[n + i];
      }
      // Grouped weights: [G, O/G, I/G, k...].
      std::vector<int64_t> wdims = ws;
      if (group > 1) {
        wdims[0] = ws[0] / group;
        wdims.insert(wdims.begin(), group);
      }
      const memory::desc src = plain(xs), dst = plain(ys), user_w = plain(wdims);
      const memory::desc any_w(memory::dims(wdims.begin(), wdims.end()), memory::data_type::f32, memory::format_tag::any);
      has_bias_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
      const memory::desc bias = has_bias_ ? plain({ys[1]}) : memory::desc();
      const bool fused = q.node.op == "FusedConv";
      const bool has_z = fused && q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (fused) {
        KILN_ASSIGN_OR_RETURN(dnnl::post_ops ops, epilogue_post_ops(q.node, has_z ? &dst : nullptr, z_index_));
        attr.set_post_ops(ops);
      }
      dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
                                           any_w, bias, dst, strides, dil, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc pd(desc, attr, cpu_engine());
      KILN_ASSIGN_OR_RETURN(weights_, prepack(*q.inputs[1].value, user_w, pd.weights_desc()));
      prim_ = dnnl::convolution_forward(pd);
      src_ = memory(src, cpu_engine(), nullptr);
      dst_ = memory(dst, cpu_engine(), nullptr);
      if (has_bias_) bias_ = memory(bias, cpu_engine(), nullptr);
      if (has_z) z_ = memory(dst, cpu_engine(), nullptr);
      scratch_ = memory(pd.scratchpad_desc(), cpu_engine(), nullptr);
      needs.workspace_bytes = pd.scratchpad_desc().get_size();
      return {};
    });
  }

  Status run(KernelContext& ctx) override {
    return guarded(ctx.node(), [&]() -> Status {
      src_.set_data_handle(const_cast<void*>(ctx.input(0).raw()));
      dst_.set_data_handle(ctx.output(0).raw());
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}};
      if (has_bias_) {
        bias_.set_data_handle(const_cast<void*>(ctx.input(2).raw()));
        args.emplace(DNNL_ARG_BIAS, bias_);
      }
      if (z_index_ >= 0) {
        z_.set_data_handle(const_cast<void*>(ctx.input(3).raw()));
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(z_index_) | DNNL_ARG_SRC_1, z_);
      }
      std::span<std::byte> ws = ctx.workspace();
      if (!ws.empty()) {
        scratch_.set_data_handle(ws.data());
        args.emplace(DNNL_ARG_SCRATCHPAD, scratch_);
      }
      prim_.execute(cpu_stream(), args);
      cpu_stream().wait();
      return {};
    });
  }

 private:
  dnnl::convolution_forward prim_;
  memory weights_, src_, dst_, bias_, z_, scratch_;
  bool has_bias_ = false;
  int z_index_ = -1;
};

}  // namespace

void register_conv(KernelRegistry& r) {
  for (const char* op : {"Conv", "FusedConv"})
    r.add(op, "cpu", KernelImpl{"onednn.conv", conv_declines, [](const KernelQuery&) { return std::make_unique<ConvKernel>(); }});
}

}  // namespace kiln::onednn
