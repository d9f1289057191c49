// Kernels and the kernel registry: per (op, device), an ordered list of implementations, most
// specialised first and the reference kernel last. An implementation may decline a node and
// say why (dtype, layout, ISA); the first that accepts runs it.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "formats/op_schema.h"
#include "runtime/target.h"

namespace kiln {

/// What a kernel sees while it runs: its node, its inputs, its outputs.
class KernelContext {
 public:
  virtual ~KernelContext() = default;
  virtual const Node& node() const = 0;
  virtual size_t num_inputs() const = 0;
  virtual bool has_input(size_t i) const = 0;
  virtual const Tensor& input(size_t i) const = 0;
  virtual size_t num_outputs() const = 0;
  /// The output buffer, allocated by the executor when the op's inference gave its shape.
  /// Kernels write into it and never replace it with a view of an input: inputs' memory is
  /// reused by the memory plan once their last reader has run. An omitted optional output is
  /// an undefined Tensor. Asking for a requested output the executor could not size (its shape
  /// depends on the data: NonZero, Unique) throws OutputNotAllocated, which the executor
  /// reports as an error about the node: such kernels check output_allocated and use
  /// allocate_output.
  virtual Tensor& output(size_t i) = 0;
  /// Whether the executor allocated output i.
  virtual bool output_allocated(size_t i) const = 0;
  /// Allocates (or replaces) output i with this dtype and shape and returns it.
  virtual Tensor& allocate_output(size_t i, DType dtype, std::vector<int64_t> shape) = 0;
  /// Runs a subgraph (If/Loop/Scan bodies) with these inputs; names it does not define resolve
  /// in the enclosing graphs.
  virtual Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs) = 0;
  /// The scratch memory the kernel asked for in prepare (KernelNeeds::workspace_bytes), 64-byte
  /// aligned; shared with the other nodes' kernels, so its contents do not survive the call.
  virtual std::span<std::byte> workspace() = 0;

  /// A user error about this node: "node 'x': <what>".
  Error error(std::string what) const { return user_error(node().where(), std::move(what)); }
};

/// Thrown by KernelContext::output for an output the executor could not size ahead; never
/// escapes the executor. A safety net: no kernel ever writes through a null output.
class OutputNotAllocated : public std::runtime_error {
 public:
  explicit OutputNotAllocated(size_t index)
      : std::runtime_error("output " + std::to_string(index) + " was not allocated"), index_(index) {}
  size_t index() const { return index_; }

 private:
  size_t index_;
};

/// The packed forms of constant weights that kernels made while planning, shared by the plans
/// of one session (Session keeps one): a plan for new input shapes whose kernel wants a weight
/// in a layout an earlier plan packed it into takes that tensor, rather than packing the weight
/// again and holding it twice (a model compiled without --input-shape plans each new shape).
/// A weight is known by its data's address, so the constants must outlive the cache.
class PackedWeights {
 public:
  /// The form of `plain` packed in `layout` as `dtype`, or undefined.
  Tensor find(const Tensor& plain, const PackedLayout& layout, DType dtype) const;
  /// Keeps `packed` (`plain` packed by a kernel) for later plans, unless it has that form or is
  /// `plain` itself (a weight stored in the layout the kernel wants, used where it is mapped: no
  /// form made while planning).
  void keep(const Tensor& plain, const Tensor& packed);
  /// A weight stored packed, unpacked for a kernel that reads it plain: once for all plans.
  Tensor unpacked(const Tensor& packed);
  /// Lets go of the forms no kernel holds any more (after a plan was dropped).
  void drop_unused();
  size_t size() const { return forms_.size(); }
  /// The bytes of the packed forms kept.
  size_t bytes() const;

 private:
  struct Form {
    const void* source;   ///< the data of the weight it was made from
    size_t source_bytes;  ///< and their size
    Tensor packed;        ///< a packed form, or (unpacked) the plain form of a packed source
  };
  std::vector<Form> forms_;
};

/// What an implementation sees when it is chosen and prepared for a node: the node, its graph,
/// the target, each input's type, shape (concrete when the plan knows it) and data (constants
/// and shape arithmetic the plan folded), and each output's type and shape as inferred.
/// Subgraph bodies are prepared once, unplanned: their shapes may be unknown. The query lives
/// for the select and prepare calls only: a kernel keeps what it needs by copying (a Tensor
/// copy shares its data).
struct KernelQuery {
  const Node& node;
  const Graph& graph;
  const Target& target;
  std::span<const InferInput> inputs;
  std::span<const InferOutput> outputs;
  /// The session's packed weights (null: none to share, as in a compile's plans).
  PackedWeights* packed_weights = nullptr;

  /// Whether optional input i is given (neither past the end nor omitted).
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i].dtype != DType::undefined; }
};

/// Constant `w` in `layout` as `dtype`, made before: `w` itself when it is stored so (a compiled
/// model's packed weight, used where it is mapped), else the form an earlier plan of the session
/// packed; undefined when the kernel must pack it (and then hands it to keep_packed).
Tensor packed_before(const KernelQuery& q, const Tensor& w, const PackedLayout& layout, DType dtype);
/// Keeps `packed`, constant `w` as the kernel packed it, for the session's later plans.
void keep_packed(const KernelQuery& q, const Tensor& w, const Tensor& packed);

/// What a kernel asks of the plan while it prepares.
struct KernelNeeds {
  size_t workspace_bytes = 0;  ///< scratch memory, KernelContext::workspace() while it runs
};

/// A kernel for one node: created and prepared once per plan (packing weights, sizing scratch
/// memory), then run many times.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual Status prepare(const KernelQuery&, KernelNeeds&) { return {}; }
  virtual Status run(KernelContext& ctx) = 0;
  /// After prepare: constant input `input` in the layout this kernel packed it into, to store
  /// in a compiled model (KernelImpl::reads_packed kernels); undefined when it keeps the input
  /// as it is.
  virtual Tensor packed_input(size_t /*input*/) const { return {}; }
  /// After prepare: the parameters it chose (a GEMM template's tile and blocking), which a
  /// compiled model records with the kernel's name and hands back to prepare next time.
  virtual std::vector<std::pair<std::string, KernelParam>> params() const { return {}; }
  /// After prepare: what the kernel is, beyond its implementation's name, for `run -v` and
  /// profiles (`gemm_f32_avx512_6x64_mc192_nc768_kc96_t1x1`); empty when the name says it all.
  virtual std::string label() const { return {}; }
  /// After prepare: an input whose memory output 0 may take, -1 for none. The plan gives output
  /// 0 that input's place when nothing reads the input after this node and both are arena
  /// intermediates of one type and size (a residual that oneDNN's sum post-op adds to the
  /// destination in place, instead of copying it there first). The kernel must work either way.
  virtual int overwrites_input() const { return -1; }
};

/// A kernel that is a plain function (the reference kernels).
using KernelFn = Status (*)(KernelContext&);

class FunctionKernel final : public Kernel {
 public:
  explicit FunctionKernel(KernelFn fn) : fn_(fn) {}
  Status run(KernelContext& ctx) override { return fn_(ctx); }

 private:
  KernelFn fn_;
};

/// The name of every op's reference kernel: the simplest correct one, the oracle others are
/// tested against.
inline constexpr std::string_view kReferenceKernel = "ref";

/// A kernel's parameters as a compiled model records them (KernelChoice::params).
using KernelParams = std::vector<std::pair<std::string, KernelParam>>;

/// One family of an implementation's parameters that `kiln compile --mode max-autotune` times:
/// each value is the parameters it sets (the others keep theirs), e.g. the axis "tile" with the
/// values {mr=8, nr=48}, {mr=6, nr=64}.
struct TuningAxis {
  std::string name;
  std::vector<KernelParams> values;
};

/// A block-size axis: each of `candidates` below `whole`, then `whole` (the product's extent:
/// one block).
inline TuningAxis size_axis(std::string name, std::initializer_list<int64_t> candidates, int64_t whole) {
  TuningAxis axis{std::move(name), {}};
  for (int64_t v : candidates)
    if (v < whole) axis.values.push_back({{axis.name, v}});
  axis.values.push_back({{axis.name, whole}});
  return axis;
}

/// One implementation of an op on a device.
struct KernelImpl {
  std::string name;  ///< "ref", "onednn.conv", "kiln.gemm_f32_avx512_8x48"
  /// nullopt if it can run the node; otherwise the reason it declines.
  std::function<std::optional<std::string>(const KernelQuery&)> declines;
  std::function<std::unique_ptr<Kernel>(const KernelQuery&)> create;
  /// The ISA features the implementation's code needs (it declines on CPUs without them); a
  /// compiled model that chose it records them in its target.
  CpuFeatures needs_isa = {};
  /// Whether prepare takes its op's prepack inputs (OpTraits::prepack_inputs) packed
  /// (Tensor::layout), in whatever layout: it uses the mapped bytes when the layout is the one
  /// it wants and repacks them otherwise. The plan unpacks packed inputs for other kernels.
  bool reads_packed = false;
  /// The default rule's preference, separate from what the implementation can run: nullopt,
  /// or why it leaves a node it could run to a later implementation that measured faster on
  /// such nodes (XNNPACK above its size limit). Only choosing by rule asks it: a node that
  /// pinned the implementation (a compiled model, max-autotune's candidates) runs on it. May
  /// be empty.
  std::function<std::optional<std::string>(const KernelQuery&)> defers;
  /// The parameter axes max-autotune searches one after the other, from the parameters the
  /// kernel would choose itself, for a node the implementation runs. Values need not be exact:
  /// prepare fits recorded parameters to the product (blocks to whole tiles). Empty: its
  /// defaults are its only candidate.
  std::function<std::vector<TuningAxis>(const KernelQuery&)> tuning_space;
};

/// The outcome of choosing a kernel for a node: the kernel, its implementation's name, and the
/// implementations tried before it with the reason each declined.
struct KernelSelection {
  std::unique_ptr<Kernel> kernel;
  std::string name;
  CpuFeatures needs_isa;  ///< the chosen implementation's KernelImpl::needs_isa
  bool reads_packed = false;  ///< the chosen implementation's KernelImpl::reads_packed
  std::vector<std::pair<std::string, std::string>> declined;
};

class KernelRegistry {
 public:
  /// Appends an implementation: earlier ones are preferred.
  void add(std::string op, std::string device, KernelImpl impl);
  /// Registers a plain-function reference kernel for a core op on the CPU.
  void add_reference(std::string op, KernelFn fn);
  std::span<const KernelImpl> find(std::string_view op, std::string_view device) const;

  /// A kernel for the node: the first implementation that does not decline, or the one the
  /// node's recorded kernel choice names (a compiled model), which must exist and accept. The
  /// error when none runs it lists every implementation tried and its reason. With
  /// `reference_only`, the reference kernel, whatever the node chose: the oracle.
  Result<KernelSelection> select(const KernelQuery& query, bool reference_only = false) const;
  /// Every (op, device) that has at least one implementation.
  std::vector<std::pair<std::string, std::string>> keys() const;
  /// This registry without the implementations named in `names` (to measure or test a
  /// provider that a preferred one would otherwise take the node from).
  KernelRegistry without(const std::vector<std::string>& names) const;

 private:
  std::map<std::pair<std::string, std::string>, std::vector<KernelImpl>, std::less<>> impls_;
};

/// A constant scalar input's value as prepare reads it (a scale, or a zero point as an integer).
inline float constant_scalar(const InferInput& in) { return static_cast<float>(in.value->as_double(0)); }
inline int32_t constant_zero_point(const InferInput& in) { return static_cast<int32_t>(in.value->as_int64(0)); }

/// The reason a node's tensors cannot go to a library or vectorised kernel, if any: every input
/// and output present must be f32 with a concrete shape, and no input empty.
std::optional<std::string> f32_and_concrete(const KernelQuery& q);
/// The same, except that input 1 (FusedConv's or FusedMatMul's weight) may also be a constant of
/// a type in `weights` (the bf16 / f16 weights of `kiln compile --precision`).
std::optional<std::string> f32_and_concrete(const KernelQuery& q, TypeSet weights);

/// The reason a Gemm node is not in the form the library and kiln GEMMs run (its inputs concrete):
/// alpha must be 1, and C (with beta 1) a row of N values or the whole [M, N].
std::optional<std::string> gemm_form_declines(const KernelQuery& q);

/// The reason an Attention node is not the f32 attention the fast kernels run (kiln's flash
/// attention, oneDNN's two matmuls), if any: the scores output, past keys and values that are
/// not f32 and shaped as K and V are, sequence lengths that are not i64 [B], inputs that are not
/// f32, 3-D or 4-D, known ahead and non-empty, a softmax precision other than f32/f16/bf16
/// (computed in f32), shapes that do not line up, a mask that is neither f32 nor bool, longer
/// than the keys (a shorter one leaves the keys past it out, as ONNX pads it with −∞) or not
/// broadcasting, rotary caches that are not f32 [B, S, D/2] (keys as many as
/// queries). Rotary inputs, sequence lengths and softcap are for the kernel to take or decline
/// (attention_rotary, attention_lengths).
std::optional<std::string> attention_declines(const KernelQuery& q);

/// Why a convolution kernel declines a FusedConv whose X comes in a form only one kernel reads,
/// or nullopt: in parts (`x_parts`, compile's fuse_concat: the inputs of a Concat read where
/// they lie; kiln's f32 GEMM reads them) or channels-first beside a channels-last Y
/// (`x_channels_first`, compile's channels_last: an image read as it comes; kiln.direct_conv).
std::optional<std::string> x_form_decline(const KernelQuery& q);
/// Whether a fused node's activation (its `activation` attribute) is none or piecewise linear
/// (ReLU, LeakyReLU, Clip): what oneDNN's post-ops apply in its registers, which the default
/// rules leave to it where kiln's kernels win by a transcendental one.
bool piecewise_linear_activation(const Node& node);
/// Whether a convolution's windows tile its image: the filter as large as the stride, no
/// padding, no dilation, no groups (a vision transformer's patch embedding, 16x16 stride 16).
/// Its windows are then the image's patches, each pixel in one: gathering them copies it once.
bool windows_tile_image(const KernelQuery& q);
/// Whether an Attention node rotates Q and K (kiln's rotary_cos / rotary_sin inputs).
bool attention_rotary(const KernelQuery& q);
/// Whether an Attention node reads each batch's count of keys (nonpad_kv_seqlen).
bool attention_lengths(const KernelQuery& q);
/// Whether an Attention node's products are bf16 (kiln's `product_type`, which `compile
/// --precision bf16` sets on a CPU with AMX): only kiln.attention_bf16_amx takes those.
bool attention_bf16_products(const KernelQuery& q);
/// An Attention node's past keys (past_key's length), 0 without a KV cache.
int64_t attention_past(const KernelQuery& q);
/// Whether an Attention node reads past keys and values or writes the present ones.
bool attention_kv_cache(const KernelQuery& q);

/// The strides, in elements, of one of Attention's tensors over its batch, head and row
/// (token) dims: element [b, h, r, 0] lies at b · batch + h · head + r · row.
struct HeadStrides {
  int64_t batch = 0, head = 0, row = 0;
  int64_t at(int64_t b, int64_t h) const { return b * batch + h * head; }
};

/// An Attention node's sizes (batch, query heads, query rows, head size, KV heads, keys, V's
/// head size) and how Q, K, V and Y lie: head-major ([B, H, S, D], 4-D) or sequence-major
/// ([B, S, H·D], 3-D, as the projections write them, with q_num_heads / kv_num_heads).
struct AttentionGeometry {
  int64_t b = 0, hq = 0, s = 0, d = 0, hkv = 0, t = 0, dv = 0;
  bool seq_major = false;
  HeadStrides q() const { return strides(hq, s, d); }
  HeadStrides k() const { return strides(hkv, t, d); }
  HeadStrides v() const { return strides(hkv, t, dv); }
  HeadStrides y() const { return strides(hq, s, dv); }

 private:
  HeadStrides strides(int64_t heads, int64_t rows, int64_t size) const {
    return seq_major ? HeadStrides{rows * heads * size, size, heads * size} : HeadStrides{heads * rows * size, rows * size, size};
  }
};

/// The geometry of an Attention node whose Q, K and V have concrete shapes of rank 3 or 4 (and,
/// for 3-D ones, positive head counts dividing the hidden sizes), else nullopt.
std::optional<AttentionGeometry> attention_geometry(const KernelQuery& q);

/// The registry with every kernel kiln was built with.
const KernelRegistry& default_kernels();

/// The oneDNN provider's kernels (runtime/onednn/): convolutions, matrix products, pooling,
/// attention.
void register_onednn_kernels(KernelRegistry& r);
/// kiln's own vectorised kernels (runtime/cpu/), one build per ISA chosen at run time.
void register_cpu_kernels(KernelRegistry& r);
/// The XNNPACK provider's kernels (runtime/xnnpack/): the tiny fully-connected layers it is
/// faster at than oneDNN.
void register_xnnpack_kernels(KernelRegistry& r);

// Reference kernels, one registration function per op family (runtime/ref/*.cc).
void register_ref_elementwise(KernelRegistry& r);
void register_ref_reduce(KernelRegistry& r);
void register_ref_shape(KernelRegistry& r);
void register_ref_nn(KernelRegistry& r);
void register_ref_quant(KernelRegistry& r);
void register_ref_misc(KernelRegistry& r);
void register_ref_control(KernelRegistry& r);
void register_ref_attention(KernelRegistry& r);
void register_ref_loss(KernelRegistry& r);

}  // namespace kiln
