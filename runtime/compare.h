// The check rule of `kiln run --check-against` (and of every test that compares a fast path
// with the reference): two tensors match when dtype and shape agree and every element passes
//   |actual − expected| ≤ atol + rtol·|expected|
// for floating types (NaN matches NaN, an infinity matches the same infinity), and is exactly
// equal for integers and bools. f16 and bf16 are compared through float.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/tensor.h"

namespace kiln {

struct CompareOptions {
  double atol = 1e-5;
  double rtol = 1e-3;
};

/// What a comparison found. For a dtype or shape mismatch only `pass`, `kind` and `summary`
/// are meaningful.
struct CompareResult {
  enum class Kind { ok, dtype_mismatch, shape_mismatch, value_mismatch };
  Kind kind = Kind::ok;
  bool pass = true;
  int64_t numel = 0;
  int64_t mismatches = 0;             ///< elements outside the tolerance
  /// The element that most exceeds its tolerance, measured as |a−b| / (atol + rtol·|b|) (a NaN
  /// or infinity mismatch counts as infinitely far; the first such is kept); when every element
  /// passes, the one with the largest such ratio. Empty `worst_index` when numel is 0.
  std::vector<int64_t> worst_index;   ///< multi-index, e.g. {0, 2, 5}; {} for a scalar too
  bool has_worst = false;
  double worst_actual = 0;
  double worst_expected = 0;
  double max_abs_error = 0;           ///< over all elements; +inf for a non-finite mismatch
  /// ‖a−b‖₂ / ‖b‖₂ over elements where both are finite; +inf if any non-finite element
  /// mismatches; 0 when both norms are 0, +inf when only ‖b‖₂ is.
  double rel_l2_error = 0;
  /// One line, lower case, no trailing period, e.g.
  /// "3 of 1000 elements differ (atol 1e-05, rtol 0.001); worst at [0, 2, 5]: got 0.51,
  /// expected 0.5; max abs error 0.01, relative l2 error 0.003".
  std::string summary;
};

/// Compares `actual` with `expected` under the rule above. Because .npy has no bfloat16, an
/// expected f32 tensor is accepted for an actual bf16 one (kiln writes bf16 outputs as f32).
CompareResult compare_tensors(const Tensor& actual, const Tensor& expected, const CompareOptions& options = {});

/// "[0, 2, 5]" (a multi-index as printed in summaries); "[]" for rank 0.
std::string index_str(const std::vector<int64_t>& index);

}  // namespace kiln
