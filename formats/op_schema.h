// The core op set: each op's name, arity, attributes and type/shape inference. Export uses
// the inference with symbolic shapes; the runtime uses the same functions with concrete shapes
// and input data, so an op's shape rules live in exactly one place. docs/ops.md describes them.
#pragma once

#include <initializer_list>

#include <bit>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"

namespace kiln {

/// What an op's inference sees of one input.
struct InferInput {
  DType dtype = DType::undefined;  ///< undefined when the optional input is omitted
  Shape shape;
  const Tensor* value = nullptr;   ///< the data when known (constants; every input at run time)
};

/// What an op's inference fills in for one output.
struct InferOutput {
  DType dtype = DType::undefined;
  Shape shape;
  Tensor value;  ///< optional: the data when the inference can compute it (small shape math)
};

/// Outputs with at most this many elements get their data computed during inference (the
/// Shape → Gather → Concat → Reshape chains of exported models: small shape math).
inline constexpr int64_t kFoldLimit = 64;

/// Passed to an op's infer function.
class InferContext {
 public:
  InferContext(const Node& node, std::vector<InferInput> inputs);

  const Node& node() const { return node_; }
  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i].dtype != DType::undefined; }
  DType dtype(size_t i) const { return inputs_[i].dtype; }
  const Shape& shape(size_t i) const { return inputs_[i].shape; }
  /// Rank of input i, -1 when unknown.
  int64_t rank(size_t i) const { return inputs_[i].shape.rank(); }
  /// The input's data if known, else nullptr. Asking for data that is not known marks the
  /// inference as depending on data (needs_data): the runtime's plan then infers this node
  /// again on each run, with the data, rather than trusting a shape worked out without it.
  const Tensor* value(size_t i) const {
    if (!has_input(i)) return nullptr;
    if (!inputs_[i].value) needs_data_ = true;
    return inputs_[i].value;
  }
  /// The input's data if known, for constant folding only: an inference whose output shape
  /// and checks do not depend on the data uses this, so that its missing data does not count.
  const Tensor* fold_value(size_t i) const { return has_input(i) ? inputs_[i].value : nullptr; }
  /// Whether the inference asked for input data it did not have (see value).
  bool needs_data() const { return needs_data_; }
  size_t num_outputs() const { return outputs_.size(); }
  void set_output(size_t i, DType dtype, Shape shape);
  /// Records the output's data as well (shape arithmetic folded at export).
  void set_output_value(size_t i, Tensor value);
  /// True at run time: every input's data is known and every dim is concrete.
  bool all_inputs_known() const;

  /// A user error about this node: "node 'x': <what>".
  Error error(std::string what) const;

  std::vector<InferOutput>& outputs() { return outputs_; }

 private:
  const Node& node_;
  std::vector<InferInput> inputs_;
  std::vector<InferOutput> outputs_;
  mutable bool needs_data_ = false;
};

using InferFn = Status (*)(InferContext&);

/// One declared attribute of an op.
struct AttrSpec {
  std::string_view name;
  AttrType type;
  bool required;
  std::string_view doc;
};

inline constexpr int kVariadic = -1;

/// A set of element types, one bit per DType: what an input of an op accepts.
class TypeSet {
 public:
  constexpr TypeSet() = default;
  /// Implicit, so that `DType::i32 | DType::i64` is a set.
  constexpr TypeSet(DType t) : bits_(uint32_t{1} << static_cast<unsigned>(t)) {}  // NOLINT
  /// Undefined (an omitted input) is in no set.
  constexpr bool contains(DType t) const {
    return t != DType::undefined && ((bits_ >> static_cast<unsigned>(t)) & 1) != 0;
  }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr int size() const { return std::popcount(bits_); }
  friend constexpr TypeSet operator|(TypeSet a, TypeSet b) {
    TypeSet r;
    r.bits_ = a.bits_ | b.bits_;
    return r;
  }
  constexpr bool operator==(const TypeSet&) const = default;
  /// The set in words, as what an op takes: "floating-point types, i32 and i64", "numeric
  /// types and bool".
  std::string str() const { return words(false); }
  /// The set in words, as what one input must be: "a floating-point type, i32 or i64", "i64".
  std::string one_of() const { return words(true); }

 private:
  std::string words(bool one) const;
  uint32_t bits_ = 0;
};

/// Two DTypes make a set too (an operator on two enums only matches a declaration taking them).
constexpr TypeSet operator|(DType a, DType b) { return TypeSet(a) | TypeSet(b); }

/// One type constraint of an op, in the spirit of ONNX's: inputs first..last (last kVariadic:
/// every input from first on) must have a type in `allowed`, or, when same_as >= 0, the type
/// of input same_as. Absent inputs are not checked. `name` is what messages call the input
/// ("indices"); empty for an op's data input.
struct TypeConstraint {
  int first = 0;
  int last = 0;
  TypeSet allowed;
  int same_as = -1;
  std::string_view name;
};

/// The type sets ops declare, and constraint builders for OpTraits::types.
namespace types {
inline constexpr TypeSet kFloat = DType::f16 | DType::bf16 | DType::f32 | DType::f64;
inline constexpr TypeSet kSigned = DType::i8 | DType::i16 | DType::i32 | DType::i64;
inline constexpr TypeSet kUnsigned = DType::u8 | DType::u16 | DType::u32 | DType::u64;
inline constexpr TypeSet kInt = kSigned | kUnsigned;
inline constexpr TypeSet kNumeric = kFloat | kInt;
inline constexpr TypeSet kBool = DType::boolean;
inline constexpr TypeSet kAny = kNumeric | kBool;
/// Index and shape operands (Gather's indices, Reshape's shape).
inline constexpr TypeSet kIndex = DType::i32 | DType::i64;

/// Input `slot` has a type in `set`.
constexpr TypeConstraint input(int slot, TypeSet set, std::string_view name = {}) { return {slot, slot, set, -1, name}; }
/// Input `slot` has input `other`'s type.
constexpr TypeConstraint same_as(int slot, int other, std::string_view name = {}) { return {slot, slot, {}, other, name}; }
/// Every input from `first` on has input `other`'s type (variadic ops).
constexpr TypeConstraint rest_same_as(int first, int other) { return {first, kVariadic, {}, other, {}}; }
}  // namespace types

/// FLOPs of a node from the graph's shapes (symbolic and unknown dims count as 1), saturating
/// at INT64_MAX: 2 x multiply-accumulates of the dense ops, a documented per-element cost of the
/// others (formats/ops/flop_models.cc), 0 for ops that only move data.
using FlopsFn = int64_t (*)(const Node&, const Graph&);

/// Bytes of memory a node's kernel reads and writes, from the graph's shapes and dtypes
/// (symbolic and unknown dims count as 1), saturating at INT64_MAX: what a roofline divides by
/// the node's time to get its bandwidth.
using BytesFn = int64_t (*)(const Node&, const Graph&);

/// The values an index input may hold without leaving what it indexes: below `hi`, or below
/// hi_per_last_axis[k] at position k of its last axis (GatherND), with the reason.
struct IndexBound {
  int64_t hi = 0;
  std::vector<int64_t> hi_per_last_axis;
  std::string reason;
};
/// The bound input `slot` of a node puts on its values when its shape is `shape` (`direct`:
/// the node reads the input itself, not a reshaped copy); nullopt where the graph does not say.
using IndexBoundFn = std::optional<IndexBound> (*)(const Graph&, const Node&, size_t slot, bool direct,
                                                   std::span<const int64_t> shape);

/// What passes, the profiler and the test tools know of an op beyond its shapes: the one place
/// op traits live.
struct OpTraits {
  /// The element types each input accepts, checked before `infer` runs (check_input_types):
  /// the checks that depend on attributes or on other inputs' data stay in `infer`. Empty: any.
  std::vector<TypeConstraint> types;
  /// Every core op has one (a test checks it): the dense ops set theirs where they are
  /// registered, register_flop_models gives every other op its model, flops::none included
  /// for ops that do no arithmetic.
  FlopsFn flops = nullptr;
  /// null: every present input is read once and every output written once (bytes::moved),
  /// right for the ops that read all of their inputs. Ops that read part of an input (Gather,
  /// Slice) or only its shape (Shape, Size) set their own. Small shape operands (Reshape's
  /// shape, Slice's starts) count as they are.
  BytesFn bytes = nullptr;
  /// Inputs holding weights that a kernel may repack into its own layout at compile time when
  /// they are constant (Conv's W, MatMul's B).
  std::vector<int> prepack_inputs;
  /// Inputs whose values reach output 0 unchanged (Identity, Reshape's data): bounds on the
  /// output's values hold for them too.
  enum class PassThrough { none, first, all } pass_through = PassThrough::none;
  IndexBoundFn index_bound = nullptr;  ///< for ops with index inputs (Gather, OneHot)
};

/// One core op.
struct OpSchema {
  std::string_view name;
  std::string_view summary;  ///< one line for docs/ops.md and --list-ops
  int min_inputs;
  int max_inputs;            ///< kVariadic for no limit
  int min_outputs;
  int max_outputs;
  std::vector<AttrSpec> attrs;
  InferFn infer;
  OpTraits traits = {};
};

/// All ops known to kiln, by (domain, name). Built once by the register_*_ops functions.
class OpRegistry {
 public:
  /// Adds (or replaces) an op; returns it so that registration can set its traits.
  OpSchema& add(std::string domain, OpSchema schema);
  const OpSchema* find(std::string_view domain, std::string_view name) const;
  /// The same op for changing after its family registered it (register_flop_models fills in
  /// traits for every op); null when absent.
  OpSchema* find_mutable(std::string_view domain, std::string_view name);
  /// Every op sorted by (domain, name).
  std::vector<std::pair<std::string, const OpSchema*>> all() const;

 private:
  std::map<std::pair<std::string, std::string>, OpSchema, std::less<>> ops_;
};

/// The registry of kiln's core ops (domain ""), built on first use.
const OpRegistry& core_ops();

/// Checks a node against its schema (arity, attribute names and types), without shapes.
Status check_node_schema(const Node& node, const OpSchema& schema);

/// Checks the inputs' element types against the op's OpTraits::types; infer_node runs it before
/// the op's `infer`. The error is about the first input that breaks a constraint: "indices must
/// be i32 or i64, got f32" for a named input; "Exp does not support i32 (it takes floating-point
/// types)" or "FusedConv is f32 only, got f64" for an op's data input; "scale type f16 differs
/// from X type f32", or "input types differ: f32 and i32" between unnamed inputs.
Status check_input_types(const OpSchema& schema, const InferContext& ctx);

/// Runs the op's inference for `node` of `graph` using what the graph knows of its inputs.
/// `known_values` supplies data for non-constant values when the caller knows it (may be null);
/// `needs_data`, when given, is set to whether the inference wanted data it did not have.
Result<std::vector<InferOutput>> infer_node(const Node& node, const Graph& graph,
                                            const std::vector<Tensor>* known_values = nullptr,
                                            bool* needs_data = nullptr);

// ---- helpers shared by the per-family inference functions ----------------------------------

/// Numpy-style broadcast of two shapes (symbolic dims kept when they agree); fails on conflict.
Result<Shape> broadcast_shapes(const Shape& a, const Shape& b, const InferContext& ctx);
/// Checks that each of `inputs` that is present (a quantized op's scales and zero points) is a
/// scalar: rank 0, or one element.
Status check_scalar_inputs(const InferContext& ctx, std::initializer_list<size_t> inputs);
/// Normalises a possibly negative axis for `rank`; fails naming the attribute when out of range.
Result<int64_t> normalize_axis(int64_t axis, int64_t rank, const InferContext& ctx,
                               std::string_view what = "axis");

/// Reads an optional dtype-name attribute ("f32"); `def` when absent, a user error when unknown.
Result<DType> dtype_attr(const InferContext& ctx, std::string_view name, DType def);

// Per-family registration (formats/ops/*.cc).
void register_elementwise_ops(OpRegistry& r);
void register_reduce_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_nn_ops(OpRegistry& r);
void register_quant_ops(OpRegistry& r);
void register_misc_ops(OpRegistry& r);
void register_control_ops(OpRegistry& r);
void register_attention_ops(OpRegistry& r);
void register_loss_ops(OpRegistry& r);
/// Runs last: gives every op that registered no FLOP model its model from the one table in
/// formats/ops/flop_models.cc.
void register_flop_models(OpRegistry& r);

}  // namespace kiln
