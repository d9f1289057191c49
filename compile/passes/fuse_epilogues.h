// fuse_epilogues: conv / matmul + bias + activation + residual + activation -> one fused node.
#pragma once

#include "formats/ir.h"

namespace kiln {

struct EpilogueFusions {
  size_t fused = 0;     ///< FusedConv / FusedMatMul nodes made
  size_t absorbed = 0;  ///< nodes folded into them (the conv or matmul itself not counted)
};

/// Rewrites `g` in place (see fuse_epilogues.cc for the patterns); the graph stays verified
/// and in topological order.
Result<EpilogueFusions> fuse_epilogues(Graph& g);

}  // namespace kiln
