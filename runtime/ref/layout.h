// Reference kernels of channels-last nodes (FusedConv and the pools with channels_last = 1,
// which `kiln compile` introduces): the channels-first reference kernel runs on X (and Z)
// transposed to [N, C, spatial...], and its output is transposed back. The oracle stays one
// implementation per op; the layout is a data movement around it.
#pragma once

#include <vector>

#include "runtime/kernel.h"

namespace kiln::ref {

/// x with its dims permuted as Transpose(perm) does, in a new contiguous tensor.
Tensor permuted(const Tensor& x, const std::vector<int64_t>& perm);

/// Runs `channels_first` on the node as it is, or on its channels-first view when the node
/// has channels_last = 1.
Status run_any_layout(KernelContext& ctx, KernelFn channels_first);

}  // namespace kiln::ref
