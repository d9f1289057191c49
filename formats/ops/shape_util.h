// Helpers shared by the shape family's inference functions (formats/ops/shape*.cc): reading
// shape operands whose data is known, symbolic dim arithmetic, and folding the data of tiny
// outputs (the Shape → Gather → Unsqueeze → Concat → Reshape chains of exported transformers).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/checked.h"
#include "formats/op_schema.h"

namespace kiln::shape_ops {

/// The data of input i as int64 values, or nullopt when the input is absent or not known.
inline std::optional<std::vector<int64_t>> known_ints(const InferContext& ctx, size_t i) {
  const Tensor* t = ctx.value(i);
  if (!t) return std::nullopt;
  return t->to_int64_vector();
}

/// a * b: known when both are, the other operand when one is a known 1, else unknown. A
/// product past the int64 range is a user error about the node.
inline Result<Dim> dim_mul(const Dim& a, const Dim& b, const InferContext& ctx) {
  if (a.is_known() && b.is_known()) {
    std::optional<int64_t> p = checked_mul(a.value, b.value);
    if (!p) return ctx.error("dims " + std::to_string(a.value) + " x " + std::to_string(b.value) + " overflow int64");
    return Dim::known(*p);
  }
  if (a.is_known() && a.value == 1) return b;
  if (b.is_known() && b.value == 1) return a;
  if ((a.is_known() && a.value == 0) || (b.is_known() && b.value == 0)) return Dim::known(0);
  return Dim::unknown();
}

/// a + b: known when both are, the other operand when one is a known 0, else unknown. A sum
/// past the int64 range is a user error about the node.
inline Result<Dim> dim_add(const Dim& a, const Dim& b, const InferContext& ctx) {
  if (a.is_known() && b.is_known()) {
    std::optional<int64_t> sum = checked_add(a.value, b.value);
    if (!sum) return ctx.error("dims " + std::to_string(a.value) + " + " + std::to_string(b.value) + " overflow int64");
    return Dim::known(*sum);
  }
  if (a.is_known() && a.value == 0) return b;
  if (b.is_known() && b.value == 0) return a;
  return Dim::unknown();
}

/// Product of dims [begin, end) of a shape with known rank.
inline Result<Dim> dim_product(const Shape& s, size_t begin, size_t end, const InferContext& ctx) {
  Dim p = Dim::known(1);
  for (size_t i = begin; i < end && i < s.dims.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(p, dim_mul(p, s.dims[i], ctx));
  }
  return p;
}

/// A shape of `rank` unknown dims (unknown rank when rank < 0, and when rank passes kMaxRank:
/// such a rank is refused where it becomes concrete, without allocating millions of dims here).
inline Shape unknown_dims(int64_t rank) {
  if (rank < 0 || rank > kMaxRank) return Shape::unknown_rank();
  return Shape(std::vector<Dim>(static_cast<size_t>(rank), Dim::unknown()));
}

/// Whether an output of this shape is small enough to fold.
inline bool foldable(std::span<const int64_t> shape) {
  int64_t n = shape_numel(shape);
  return n >= 0 && n <= kFoldLimit;
}

/// Copies element `src_index` of `src` to element `dst_index` of `dst` (same dtype).
inline void copy_element(Tensor& dst, int64_t dst_index, const Tensor& src, int64_t src_index) {
  size_t es = dtype_size(dst.dtype());
  std::memcpy(static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_index) * es,
              static_cast<const char*>(src.raw()) + static_cast<size_t>(src_index) * es, es);
}

/// Row-major strides of a concrete shape, in elements.
inline std::vector<int64_t> strides_of(std::span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

/// Checks an index from data against a dim of size n (negative indices count from the end)
/// and returns it normalised to [0, n).
inline Result<int64_t> check_index(int64_t idx, int64_t n, int64_t axis, const InferContext& ctx) {
  if (idx < -n || idx >= n)
    return ctx.error("index " + std::to_string(idx) + " is out of range for axis " + std::to_string(axis) +
                     " of size " + std::to_string(n));
  return idx < 0 ? idx + n : idx;
}

/// An int64 1-D tensor from values.
inline Tensor int64_tensor(const std::vector<int64_t>& v) {
  return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v);
}

/// One sliced axis: the first index taken, the step, and how many elements are taken.
struct SliceDim {
  int64_t start = 0;
  int64_t step = 1;
  int64_t len = 0;
};

/// ONNX Slice semantics for a dim of size d: negative starts/ends count from the end, then
/// both are clamped ([0, d] for positive steps, [-1, d-1] for negative ones). step != 0.
inline SliceDim slice_dim(int64_t d, int64_t start, int64_t end, int64_t step) {
  auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; };
  if (start < 0) start += d;  // no overflow: d >= 0
  if (end < 0) end += d;
  SliceDim s;
  s.step = step;
  if (step > 0) {
    s.start = clamp(start, 0, d);
    end = clamp(end, 0, d);
    s.len = end > s.start ? (end - s.start - 1) / step + 1 : 0;
  } else {
    s.start = clamp(start, -1, d - 1);
    end = clamp(end, -1, d - 1);
    int64_t mag = step == INT64_MIN ? INT64_MAX : -step;  // the distance is at most d anyway
    s.len = s.start > end ? (s.start - end - 1) / mag + 1 : 0;
  }
  if (s.len == 0) s.start = 0;
  return s;
}

}  // namespace kiln::shape_ops
