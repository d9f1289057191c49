// Random inputs for `kiln run` (and `profile`) when the user gives none: deterministic for a
// seed on every platform (a fixed splitmix64 stream, not std:: distributions, whose output
// differs between standard libraries), and valid for the model where the graph says what
// valid means.
//
// Rules, by the input's dtype:
//   - floats (f32, f64, f16, bf16): uniform in [-1, 1), drawn on a grid the type represents
//     exactly (2^-23 for f32, 2^-52 for f64, 2^-10 for f16, 2^-7 for bf16), so no value rounds to 1;
//   - bool: 0 or 1 with equal odds;
//   - integers: [0, hi) where hi comes from the graph's uses of the input, the smallest over all
//     uses (and never above the dtype's maximum + 1):
//       * indices (input 1) of Gather, GatherElements or ScatterElements: the size of the data
//         input (input 0) along the node's `axis` (default 0) when the graph knows it;
//       * indices (input 1) of GatherND or ScatterND used directly: per position k along the
//         indices' last axis, the size of data dim batch_dims + k (GatherND's `batch_dims`,
//         default 0) when all those dims are known;
//       * indices (input 0) of OneHot whose depth (input 1) is a constant: [0, depth);
//       uses are followed through value-preserving ops (Cast, Identity, Reshape, Flatten,
//       Squeeze, Unsqueeze, Expand, Transpose, Slice, Concat), since the index values survive
//       them (GatherND/ScatterND only when used directly: a reshape moves the positions);
//     otherwise [0, 2) when the input's name contains "mask" (attention masks are 0/1), and
//     [0, 10) for anything else: small, non-negative, safe for most uses the graph cannot tell.
// Nested subgraphs (If/Loop bodies) are not searched. Symbolic dims are not resolved here:
// the caller passes each input's concrete shape.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"

namespace kiln {

/// How random_input fills one input, and why (for `kiln run -v`).
struct RandomRange {
  enum class Kind { uniform_float, boolean, integer } kind = Kind::uniform_float;
  int64_t hi = 0;  ///< integers: values in [0, hi)
  /// GatherND/ScatterND indices: the bound per position along the last axis; the element at
  /// last-axis position k uses min(hi, hi_per_last_axis[k]). Empty otherwise.
  std::vector<int64_t> hi_per_last_axis;
  std::string reason;  ///< e.g. "indices of Gather node 'emb' into a dim of size 30522"
};

/// The range random_input uses for `input` filled with `shape` (the shape matters only for
/// GatherND-style per-position bounds).
RandomRange random_input_range(const Graph& g, ValueId input, std::span<const int64_t> shape);

/// A tensor of the input's dtype and the given concrete shape, filled by the rules above from
/// a stream seeded by `seed` alone (same seed, same values). Use input_seed() so that inputs
/// of one run differ from each other.
Tensor random_input(const Graph& g, ValueId input, std::vector<int64_t> shape, uint64_t seed);

/// A seed for one input's stream, derived from the run's seed and the input's name.
uint64_t input_seed(uint64_t seed, std::string_view input_name);

/// One random tensor per graph input (in graph.inputs order) with the given concrete shapes,
/// each seeded with input_seed(seed, name). `shapes` has one entry per graph input.
std::vector<Tensor> random_inputs(const Graph& g, const std::vector<std::vector<int64_t>>& shapes, uint64_t seed);

}  // namespace kiln
