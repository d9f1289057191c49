// The pass table: the default pipeline, read top to bottom.
#include "compile/pass.h"

#include <array>

namespace kiln {

namespace {

// Order matters: shapes first (folding needs concrete shapes to compute shape arithmetic),
// folding before CSE (folded constants that come out equal are merged), CSE before the weight
// folds (they need each intermediate to have one reader), dead code last (every pass before it
// may leave unread values behind).
constexpr std::array kPasses = {
    PassInfo{"specialize_shapes", "bind symbolic input dims from --input-shape and re-infer every shape", specialize_shapes},
    PassInfo{"fold_constants", "evaluate nodes whose inputs are all constants, and shape arithmetic inference computed",
             fold_constants},
    PassInfo{"cse", "merge identical constants and nodes with the same op, attributes and inputs",
             eliminate_common_subexpressions},
    PassInfo{"fold_batchnorm", "fold BatchNormalization into the constant weights of the Conv, ConvTranspose, Gemm or MatMul before it",
             fold_batchnorm},
    PassInfo{"fuse_linear_bias", "MatMul of a 2-D input by a constant 2-D weight, then Add of a constant row bias -> Gemm",
             fuse_linear_bias},
    PassInfo{"eliminate_dead", "drop nodes and values the graph outputs do not need, unused constants included",
             eliminate_dead},
};

}  // namespace

std::span<const PassInfo> all_passes() { return kPasses; }

const PassInfo* find_pass(std::string_view name) {
  for (const PassInfo& p : kPasses)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace kiln
