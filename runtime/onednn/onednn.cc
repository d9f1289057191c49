// Shared pieces of the oneDNN provider (onednn.h).
#include "runtime/onednn/onednn.h"

#include "formats/ops/nn_util.h"

#include <algorithm>
#include <cstring>

namespace kiln {

namespace onednn {

using dnnl::algorithm;
using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& cpu_stream() {
  static dnnl::stream stream(cpu_engine());
  return stream;
}

namespace {

memory::dims to_dims(const std::vector<int64_t>& v) { return memory::dims(v.begin(), v.end()); }

memory::dims row_major_strides(const memory::dims& dims) {
  memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

}  // namespace

memory::desc plain(const std::vector<int64_t>& dims, memory::data_type type) {
  memory::dims d = to_dims(dims);
  return memory::desc(d, type, row_major_strides(d));
}

memory::desc channels_last(const std::vector<int64_t>& dims, memory::data_type type) {
  memory::dims d = to_dims(dims);
  memory::dims s(d.size(), 1);
  memory::dim stride = d.size() > 1 ? d[1] : 1;  // C innermost, then the spatial dims, then N
  for (size_t i = d.size(); i-- > 2;) {
    s[i] = stride;
    stride *= d[i];
  }
  s[0] = stride;
  return memory::desc(d, type, s);
}

memory::desc transposed(const std::vector<int64_t>& dims) {
  memory::dims d = to_dims(dims);
  memory::dims swapped = d;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  memory::dims s = row_major_strides(swapped);
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return memory::desc(d, memory::data_type::f32, s);
}

Result<ConvGeometry> conv_geometry(const KernelQuery& q, size_t weight) {
  ConvGeometry c;
  c.xs = q.inputs[0].shape.concrete();
  c.ys = q.outputs[0].shape.concrete();
  const std::vector<int64_t> ws = q.inputs[weight].shape.concrete();
  if (nn::channels_last(q.node)) {
    c.xs = nn::permute(c.xs, nn::channels_first_perm(c.xs.size()));
    c.ys = nn::permute(c.ys, nn::channels_first_perm(c.ys.size()));
  }
  c.group = q.node.attr_int("group", 1);
  const std::vector<int64_t> spatial(c.xs.begin() + 2, c.xs.end());
  c.kernel.assign(ws.begin() + 2, ws.end());
  KILN_ASSIGN_OR_RETURN(nn::Window w, nn::resolve_window(q.node, spatial, c.kernel, false));
  const size_t n = spatial.size();
  c.strides.assign(w.strides.begin(), w.strides.end());
  c.dilations.resize(n);
  c.pad_l.resize(n);
  c.pad_r.resize(n);
  for (size_t i = 0; i < n; ++i) {
    c.dilations[i] = w.dilations[i] - 1;
    c.pad_l[i] = w.pads[i];
    c.pad_r[i] = w.pads[n + i];
  }
  c.wdims = ws;
  if (c.group > 1) {
    c.wdims[0] = ws[0] / c.group;
    c.wdims.insert(c.wdims.begin(), c.group);
  }
  return c;
}

bool append_activation(dnnl::post_ops& ops, const ActivationSpec& act) {
  switch (act.kind) {
    case Activation::none: return true;
    case Activation::relu: ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f); return true;
    case Activation::leaky_relu: ops.append_eltwise(1.f, algorithm::eltwise_relu, act.a, 0.f); return true;
    case Activation::clip: ops.append_eltwise(1.f, algorithm::eltwise_clip, act.a, act.b); return true;
    case Activation::sigmoid: ops.append_eltwise(1.f, algorithm::eltwise_logistic, 0.f, 0.f); return true;
    case Activation::tanh: ops.append_eltwise(1.f, algorithm::eltwise_tanh, 0.f, 0.f); return true;
    case Activation::hard_sigmoid:
      // max(0, min(1, a·x + b)): oneDNN 2.6 has no hardsigmoid, a linear step and a clip do it.
      ops.append_eltwise(1.f, algorithm::eltwise_linear, act.a, act.b);
      ops.append_eltwise(1.f, algorithm::eltwise_clip, 0.f, 1.f);
      return true;
    case Activation::hard_swish: ops.append_eltwise(1.f, algorithm::eltwise_hardswish, 0.f, 0.f); return true;
    case Activation::gelu: ops.append_eltwise(1.f, algorithm::eltwise_gelu_erf, 0.f, 0.f); return true;
    case Activation::gelu_tanh: ops.append_eltwise(1.f, algorithm::eltwise_gelu_tanh, 0.f, 0.f); return true;
    case Activation::silu: ops.append_eltwise(1.f, algorithm::eltwise_swish, 1.f, 0.f); return true;
  }
  return false;
}

Result<dnnl::post_ops> epilogue_post_ops(const Node& node, const memory::desc* z, int& z_index) {
  dnnl::post_ops ops;
  z_index = -1;
  KILN_ASSIGN_OR_RETURN(ActivationSpec act, read_activation(node, "activation"));
  KILN_ASSIGN_OR_RETURN(ActivationSpec post, read_activation(node, "post_activation"));
  if (!append_activation(ops, act)) return internal_error(node.where(), "no oneDNN post-op for the activation");
  if (z) {
    // The residual as a sum post-op: the kernel copies Z into the destination first. (A binary
    // add post-op would read Z directly, but oneDNN 2.6's GEMM-based convolutions run it
    // element by element, 50x slower than the convolution itself.)
    z_index = ops.len();
    ops.append_sum(1.f);
  }
  if (!append_activation(ops, post)) return internal_error(node.where(), "no oneDNN post-op for the post-activation");
  return ops;
}

namespace {

// Relabels the last two dims of a layout (a transposed operand: the kernel's dims are the
// tensor's with the last two swapped).
void swap_last_two(PackedLayout& l) {
  const size_t r = l.dims.size();
  if (r < 2) return;
  std::swap(l.dims[r - 1], l.dims[r - 2]);
  std::swap(l.padded_dims[r - 1], l.padded_dims[r - 2]);
  std::swap(l.strides[r - 1], l.strides[r - 2]);
  for (int32_t& d : l.inner_dims)
    if (d == static_cast<int32_t>(r - 1)) d = static_cast<int32_t>(r - 2);
    else if (d == static_cast<int32_t>(r - 2)) d = static_cast<int32_t>(r - 1);
}

memory::desc desc_of(PackedLayout l, bool swap_last2, dnnl_data_type_t type) {
  if (swap_last2) swap_last_two(l);
  dnnl_memory_desc_t md{};
  md.ndims = static_cast<int>(l.dims.size());
  md.data_type = type;
  md.format_kind = dnnl_blocked;
  for (size_t d = 0; d < l.dims.size(); ++d) {
    md.dims[d] = l.dims[d];
    md.padded_dims[d] = l.padded_dims[d];
    md.format_desc.blocking.strides[d] = l.strides[d];
  }
  md.format_desc.blocking.inner_nblks = static_cast<int>(l.inner_blocks.size());
  for (size_t k = 0; k < l.inner_blocks.size(); ++k) {
    md.format_desc.blocking.inner_blks[k] = l.inner_blocks[k];
    md.format_desc.blocking.inner_idxs[k] = l.inner_dims[k];
  }
  return memory::desc(md);
}

}  // namespace

std::optional<PackedLayout> layout_of(const memory::desc& desc, bool swap_last2) {
  const dnnl_memory_desc_t& md = desc.data;
  if (md.format_kind != dnnl_blocked || (md.data_type != dnnl_f32 && md.data_type != dnnl_bf16) || md.extra.flags != 0 || md.offset0 != 0)
    return std::nullopt;
  PackedLayout l;
  const dnnl_blocking_desc_t& b = md.format_desc.blocking;
  for (int d = 0; d < md.ndims; ++d) {
    if (md.padded_offsets[d] != 0) return std::nullopt;
    l.dims.push_back(md.dims[d]);
    l.padded_dims.push_back(md.padded_dims[d]);
    l.strides.push_back(b.strides[d]);
  }
  for (int k = 0; k < b.inner_nblks; ++k) {
    l.inner_blocks.push_back(b.inner_blks[k]);
    l.inner_dims.push_back(static_cast<int32_t>(b.inner_idxs[k]));
  }
  if (swap_last2) swap_last_two(l);
  return l;
}

Result<memory> prepack(const Tensor& w, const memory::desc& user, const memory::desc& wanted, bool swap_last2) {
  // Where the elements come from: the plain tensor by default; a compiled model's packed weight
  // from its own layout, or used where it is mapped when that is the layout this primitive wants
  // (oneDNN only reads weights); packed over other dims (a batch of 1 the primitive does not
  // have), through the plain form.
  const Tensor* src = &w;
  Tensor plain;
  memory::desc from = user;
  if (const PackedLayout* l = w.layout()) {
    const std::optional<PackedLayout> want = layout_of(wanted, swap_last2);
    if (want && want->same_placement(*l) && w.nbytes() >= wanted.get_size())
      return memory(wanted, cpu_engine(), const_cast<void*>(w.raw()));
    from = desc_of(*l, swap_last2, w.dtype() == DType::bf16 ? dnnl_bf16 : dnnl_f32);
    if (from.dims() != wanted.dims()) {
      plain = unpack(w);
      src = &plain;
      from = user;
    }
  }
  memory dst(wanted, cpu_engine());
  if (from == wanted) {
    std::memcpy(dst.get_data_handle(), src->raw(), std::min(src->nbytes(), wanted.get_size()));
    return dst;
  }
  memory in(from, cpu_engine(), const_cast<void*>(src->raw()));
  dnnl::reorder(in, dst).execute(cpu_stream(), in, dst);
  cpu_stream().wait();
  return dst;
}

Tensor packed_weights(const Tensor& original, const memory& weights, bool swap_last2, std::string_view primitive) {
  std::optional<PackedLayout> l = layout_of(weights.get_desc(), swap_last2);
  if (!l || shape_numel(l->dims) != original.numel()) return {};
  const dnnl_version_t* v = dnnl_version();
  l->packed_for = "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " " +
                  std::string(primitive);
  // The tensor keeps the oneDNN memory alive, and with it the buffer it owns, or the original
  // whose mapped bytes it uses in place.
  struct Held {
    memory weights;
    Tensor original;
  };
  auto held = std::make_shared<Held>(Held{weights, original});
  void* data = weights.get_data_handle();
  return Tensor::packed(original.dtype(), original.shape(), std::move(*l), weights.get_desc().get_size(), data,
                        std::shared_ptr<void>(held, data));
}

Result<PrepackedWeights> prepack_weights(const KernelQuery& q, const Tensor& w, const memory::desc& user, const memory::desc& wanted,
                                         bool swap_last2, std::string_view primitive) {
  const std::optional<PackedLayout> want = layout_of(wanted, swap_last2);
  const Tensor earlier = want && q.packed_weights ? q.packed_weights->find(w, *want, w.dtype()) : Tensor();
  const Tensor& from = earlier.defined() ? earlier : w;
  KILN_ASSIGN_OR_RETURN(memory weights, prepack(from, user, wanted, swap_last2));
  Tensor packed = packed_weights(from, weights, swap_last2, primitive);
  if (!earlier.defined()) keep_packed(q, w, packed);
  return PrepackedWeights{std::move(weights), std::move(packed)};
}

void execute(const dnnl::primitive& prim, std::unordered_map<int, memory>& args, memory& scratch,
             std::span<std::byte> workspace) {
  if (!workspace.empty()) {
    scratch.set_data_handle(workspace.data());
    args.emplace(DNNL_ARG_SCRATCHPAD, scratch);
  }
  prim.execute(cpu_stream(), args);
  cpu_stream().wait();
}

bool foreign_target(const Target& target) { return !CpuFeatures::host().missing(target.cpu.names()).empty(); }

}  // namespace onednn

void register_onednn_kernels(KernelRegistry& r) {
  onednn::register_conv(r);
  onednn::register_qconv(r);
  onednn::register_matmul(r);
  onednn::register_pool(r);
  onednn::register_attention(r);
  onednn::register_cast(r);
}

}  // namespace kiln

