// Data-movement helpers shared by the shape family's reference kernels (runtime/ref/shape*.cc):
// a strided copy that merges contiguous dims and copies contiguous rows with memcpy (Transpose,
// Slice, Expand, Tile, DepthToSpace all reduce to it), index reading, and output allocation for
// kernels whose output shape depends on the data.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/kernel.h"

namespace kiln::ref_shape {

/// dst (contiguous, row-major over `shape`) = src elements at `offset + sum(idx[a] * strides[a])`.
/// Strides and offset are in elements of `elem` bytes; strides may be 0 (broadcast) or negative.
void copy_strided(void* dst, const void* src, size_t elem, std::vector<int64_t> shape,
                  std::vector<int64_t> strides, int64_t offset);

/// The product of dims [begin, end) (those past the shape's rank count as 1).
inline int64_t dims_product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) p *= shape[i];
  return p;
}

/// Row-major strides of a shape, in elements.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape);

/// Element i of an integer index tensor (i32 or i64) as int64.
inline int64_t index_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::i32 ? t.data<int32_t>()[i] : t.dtype() == DType::i64 ? t.data<int64_t>()[i] : t.as_int64(i);
}

/// The output buffer the executor allocated when it matches, else a new one.
inline Tensor& output_for(KernelContext& ctx, size_t i, DType dtype, const std::vector<int64_t>& shape) {
  if (ctx.output_allocated(i)) {
    Tensor& o = ctx.output(i);
    if (o.dtype() == dtype && o.shape() == shape) return o;
  }
  return ctx.allocate_output(i, dtype, shape);
}

/// memcpy that accepts zero-size copies from null pointers (empty tensors have no storage).
inline void copy_bytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

}  // namespace kiln::ref_shape
