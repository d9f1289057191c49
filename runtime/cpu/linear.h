// What the linear-layer kernels (QFusedMatMul's, WoqFusedMatMul's) read off their query: A's
// rows M, and B's K and N from its 2-D shape ([K, N], or [N, K] with transB).
#pragma once

#include "runtime/kernel.h"

namespace kiln::cpu {

struct LinearDims {
  int64_t m = 0, n = 0, k = 0;
  bool trans = false;
};

/// The dims of a product of input 0 (A, any rank, its last dim K) by input `b` (B, 2-D); a user
/// error naming the node when A's last dim is not B's K. Shapes must be concrete.
inline Result<LinearDims> linear_dims(const KernelQuery& q, size_t b) {
  const std::vector<int64_t> as = q.inputs[0].shape.concrete(), bs = q.inputs[b].shape.concrete();
  LinearDims d;
  d.trans = q.node.attr_int("transB", 0) != 0;
  d.k = d.trans ? bs[1] : bs[0];
  d.n = d.trans ? bs[0] : bs[1];
  if (as.back() != d.k)
    return user_error(q.node.where(), "A's last dim " + std::to_string(as.back()) + " is not B's K " + std::to_string(d.k));
  d.m = d.k > 0 ? shape_numel(as) / d.k : 0;
  return d;
}

}  // namespace kiln::cpu
