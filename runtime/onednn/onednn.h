// The oneDNN provider (Debian's oneDNN 2.6): convolutions, matrix products, pooling and the
// f32 <-> bf16 Cast as oneDNN primitives, created once per plan in prepare (on concrete
// shapes, with constant weights reordered into the layout the primitive wants) and executed on
// the tensors' memory at run time. oneDNN shares kiln's GNU OpenMP pool; its scratchpad is the
// kernel workspace.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <optional>
#include <span>
#include <unordered_map>
#include <string>
#include <vector>

#include "formats/ops/epilogue.h"
#include "runtime/kernel.h"

namespace kiln::onednn {

/// The CPU engine and the stream kernels execute on (one per process; oneDNN's CPU streams
/// run in the calling thread's OpenMP pool).
dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();

/// A plain (row-major) descriptor of these dims (f32 unless `type` says otherwise).
dnnl::memory::desc plain(const std::vector<int64_t>& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32);
/// A descriptor of logical dims [N, C, spatial...] stored channels-last, [N, spatial..., C]
/// (nhwc): the layout of a channels_last node's activations.
dnnl::memory::desc channels_last(const std::vector<int64_t>& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32);
/// A row-major descriptor of the last two dims swapped in memory (a transposed operand).
dnnl::memory::desc transposed(const std::vector<int64_t>& dims);

/// A convolution's geometry in oneDNN's terms: X's and Y's logical [N, C, spatial...] dims (a
/// channels_last node's permuted back), the weight dims grouped as [G, O/G, I/G, k...] when
/// group > 1, the spatial kernel, strides, dilations (oneDNN counts the gaps) and pads.
struct ConvGeometry {
  std::vector<int64_t> xs, ys, wdims, kernel;
  int64_t group = 1;
  dnnl::memory::dims strides, dilations, pad_l, pad_r;
};
/// The geometry of a Conv-like node whose weight is input `weight` (concrete shapes).
Result<ConvGeometry> conv_geometry(const KernelQuery& q, size_t weight);

/// Appends the oneDNN post-ops for an activation: false when oneDNN has none for it.
bool append_activation(dnnl::post_ops& ops, const ActivationSpec& act);

/// The fused ops' epilogue as post-ops: activation, residual add (a sum post-op when `z` is
/// given: the caller copies Z into the destination before executing), post activation. Sets
/// `z_index` to the residual's post-op index, -1 without one.
Result<dnnl::post_ops> epilogue_post_ops(const Node& node, const dnnl::memory::desc* z, int& z_index);

/// A weight tensor reordered once into the layout `wanted` a primitive chose for it, from its
/// plain layout `user`, or from its packed layout (Tensor::layout; `swap_last2`: the layout's
/// dims are the primitive's with the last two swapped, a transposed operand). A packed weight
/// already in the wanted layout is used where it is, without a copy.
Result<dnnl::memory> prepack(const Tensor& w, const dnnl::memory::desc& user, const dnnl::memory::desc& wanted,
                             bool swap_last2 = false);

/// A oneDNN blocked layout of f32 or bf16 elements as kiln's PackedLayout (nullopt for layouts
/// it cannot describe: other element types, non-blocked formats, compensation, offsets).
std::optional<PackedLayout> layout_of(const dnnl::memory::desc& desc, bool swap_last2 = false);

/// The weights a primitive prepared, as a packed tensor of `original`'s shape that a compiled
/// model stores (Kernel::packed_input); undefined when the layout cannot be described.
Tensor packed_weights(const Tensor& original, const dnnl::memory& weights, bool swap_last2, std::string_view primitive);

/// A constant weight prepacked (`weights`) and as the packed tensor to store (`packed`).
struct PrepackedWeights {
  dnnl::memory weights;
  Tensor packed;
};
/// prepack and packed_weights, through the session's packed weights (KernelQuery::
/// packed_weights): `w` as an earlier plan packed it in `wanted`'s layout is used where it is,
/// and a weight packed here is kept for later plans.
Result<PrepackedWeights> prepack_weights(const KernelQuery& q, const Tensor& w, const dnnl::memory::desc& user,
                                         const dnnl::memory::desc& wanted, bool swap_last2, std::string_view primitive);

/// Executes `prim` with `args` on the CPU stream and waits; `scratch` (a memory of the
/// primitive's scratchpad descriptor) is bound to the kernel's workspace when it has one.
void execute(const dnnl::primitive& prim, std::unordered_map<int, dnnl::memory>& args, dnnl::memory& scratch,
             std::span<std::byte> workspace);

/// Whether `target` has a feature this CPU lacks (`kiln compile --target` naming another CPU).
/// oneDNN creates primitives for the CPU it runs on only: a kernel that cannot create one for
/// such a target keeps its choice unprepared (the weights as given), to prepare where the model
/// runs; a session here refuses the model anyway.
bool foreign_target(const Target& target);

/// The primitive descriptor `make` creates; nullopt where oneDNN has none on this CPU for a
/// foreign target (the kernel then stays unprepared), oneDNN's error otherwise.
template <class F>
auto primitive_for(const Target& target, F&& make) -> std::optional<decltype(make())> {
  try {
    return make();
  } catch (const dnnl::error&) {
    if (!foreign_target(target)) throw;
    return std::nullopt;
  }
}

/// A kernel's run when its prepare found no primitive for a foreign target.
inline Status unprepared(const KernelContext& ctx) {
  return internal_error(ctx.node().where(), "its kernel was compiled for a CPU oneDNN has no primitive for here");
}

/// Wraps a oneDNN call: its exceptions become an internal error about the node.
template <class F>
Status guarded(const Node& node, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    return internal_error(node.where(), std::string("oneDNN: ") + e.what());
  }
}

// Registration, one per primitive family.
void register_conv(KernelRegistry& r);
void register_qconv(KernelRegistry& r);
void register_matmul(KernelRegistry& r);
void register_pool(KernelRegistry& r);
void register_attention(KernelRegistry& r);
void register_cast(KernelRegistry& r);

}  // namespace kiln::onednn
