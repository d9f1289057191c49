// What the pattern passes share: looking at a graph's dataflow around a node (who produces a
// value, who reads it, constants) and replacing matched nodes with new ones in one commit.
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "formats/ir.h"

namespace kiln {

class Matcher {
 public:
  explicit Matcher(const Graph& g);

  const Graph& graph() const { return g_; }
  /// The node producing `v` when it is a core op named `op` (any op when empty), else null.
  const Node* def(ValueId v, std::string_view op = {}) const;
  /// Index of the node producing `v`, or -1.
  int32_t def_index(ValueId v) const { return v >= 0 ? producer_[static_cast<size_t>(v)] : -1; }
  /// Whether every read of `v` is by the nodes listed (through inputs, not captures) and `v` is
  /// not a graph output: the value may disappear when those nodes do.
  bool only_read_by(ValueId v, std::initializer_list<const Node*> readers) const;
  /// The node reading `v` when it has exactly one reader and is not a graph output, else null.
  const Node* single_reader(ValueId v) const;
  /// The value of a one-element f32 constant.
  std::optional<float> scalar(ValueId v) const;
  /// Whether `v` is a one-element f32 constant within 1e-6 (relative) of `want`.
  bool is_scalar(ValueId v, double want) const;
  /// The input of a two-input node other than `v` (kNoValue when it reads `v` twice or not at all).
  static ValueId other(const Node& n, ValueId v);
  /// The reduction axes of a ReduceX node (attribute or constant input), or nullopt.
  std::optional<std::vector<int64_t>> reduce_axes(const Node& n) const;
  size_t index(const Node& n) const { return static_cast<size_t>(&n - g_.nodes.data()); }
  std::vector<size_t> indices(const std::vector<const Node*>& nodes) const;

 private:
  const Graph& g_;
  std::vector<int32_t> producer_;
  std::vector<std::vector<Use>> uses_;
  std::set<ValueId> outputs_;
};

/// Collects nodes to remove and nodes to add, then applies them together: the new nodes take
/// their place in dependence order and whatever no longer feeds an output is dropped.
class Rewrite {
 public:
  explicit Rewrite(Graph& g) : g_(g), removed_(g.nodes.size(), 0) {}
  /// Whether node i is already claimed by an earlier match (a match must not overlap it).
  bool taken(size_t i) const { return i < removed_.size() && removed_[i]; }
  /// Whether none of these nodes is claimed yet.
  bool free(const std::vector<size_t>& nodes) const {
    return std::none_of(nodes.begin(), nodes.end(), [&](size_t i) { return taken(i); });
  }
  void remove(size_t i) { removed_[i] = 1; }
  void add(Node n) { added_.push_back(std::move(n)); }
  /// Replaces the matched nodes (indices into the graph, free) by `n`, which takes their sources.
  void replace(const std::vector<size_t>& matched, Node n);
  size_t count() const { return added_.size(); }
  Status commit();

 private:
  Graph& g_;
  std::vector<char> removed_;
  std::vector<Node> added_;
};

/// The integers of an i64 or i32 constant of rank 0 or 1 (indices, shapes, a Slice's operands), or
/// nullopt.
std::optional<std::vector<int64_t>> int_constant(const Graph& g, ValueId v);

/// A Slice's constant operands, with ONNX's defaults for omitted axes (0, 1, ...) and steps (1s);
/// nullopt when one is not a constant or their lengths differ.
struct SliceSpec {
  std::vector<int64_t> starts, ends, axes, steps;
};
std::optional<SliceSpec> constant_slice(const Graph& g, const Node& slice);

/// One entry of a small integer tensor computed from shapes: a number, or dim `axis` of `of`.
struct DimTerm {
  int64_t value = 0;
  ValueId of = kNoValue;
  int64_t axis = 0;
};

/// The entries of an i64 / i32 value of rank 0 or 1 that shape arithmetic computes (Shape,
/// Gather, Unsqueeze, Squeeze, Concat, Slice, Cast and Identity over constants and shapes), as
/// numbers and dims of values; nullopt for anything else.
std::optional<std::vector<DimTerm>> dim_terms(const Matcher& m, ValueId v);

/// The length of `range` when it is Range(0, n, 1) with n one dim of a value (a sequence length
/// as exporters take it: Gather(Shape(input_ids), 1)), else nullopt.
std::optional<DimTerm> range_length(const Matcher& m, const Node& range);

/// The value `v` is computed from by ops that keep their input's shape (a quantized model's
/// QuantizeLinear and DequantizeLinear, Cast, Identity), as far back as they go: two values of
/// one origin have one shape.
ValueId shape_origin(const Matcher& m, ValueId v);

/// Whether dim `axis` of `of` is dim d of x: x's own in its place (or that of what x dequantizes:
/// shape_origin), or a dim of the same symbol (a session binds each symbol to one size, and
/// inference carries a symbol only to dims equal to it).
bool same_dim(const Matcher& m, ValueId of, int64_t axis, ValueId x, size_t d);

/// Erases the shape arithmetic that nothing reads (Shape, Gather, Unsqueeze, Squeeze, Concat,
/// Slice, Cast and Identity nodes writing i64 / i32 values of rank 0 or 1, until none is left
/// dead), once a rewrite stopped reading it: a pattern asking whether a value is read by one
/// node alone must not count a dead Shape of it.
void erase_dead_shape_arithmetic(Graph& g);

/// Whether `n` is a core FusedConv multiplying `x` pointwise: X its input 0 and read there only,
/// whole (no x_parts) and channels-last (channels_last 1, not x_channels_first); 1x1 by a
/// constant f32 weight [K, C, 1, 1] (with `f16`, an f16 one too: `--precision fp16`'s, which
/// kiln's f32 GEMM widens), stride 1, no padding, dilation or groups (kiln's f32 GEMM runs it as
/// the product of X's pixels by the weight).
bool pointwise_conv_of(const Graph& g, const Node& n, ValueId x, bool f16 = false);
/// Whether such a convolution `n` (X [N, H, W, C] at input 0) may be fused into a kernel that
/// computes in f32: by an f32 weight, or by an f16 one (`--precision fp16`, which kiln's f32
/// kernels widen) where cpu::gemm::f16_pointwise_fuses gives it to them: where the f16 GEMM's
/// rule leaves it to f32 anyway, or where a fused block outruns the f16 GEMM.
/// The passes that hand a convolution to those kernels alone (fuse_pointwise_depthwise,
/// fuse_concat) ask it.
bool pointwise_fuses_in_f32(const Graph& g, const Node& n);

/// Whether `v` is an f32 constant of shape [d] (a normalization's scale or bias).
bool per_feature(const Graph& g, ValueId v, int64_t d);
/// Whether `n` is a ReduceMean of `x` over its last axis only, keeping dims.
bool mean_over_last(const Matcher& m, const Node* n, ValueId x);

/// The sources of the nodes a fused node replaces, in order, without repeats (a node without
/// sources contributes its own name).
std::vector<std::string> merged_sources(const Graph& g, const std::vector<size_t>& nodes);

}  // namespace kiln
