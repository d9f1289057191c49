// Byte counts of nodes (OpTraits::bytes): the memory a node's kernel reads and writes, which a
// roofline divides by the node's time. Counts come from the graph's shapes and dtypes, with
// symbolic and unknown dims as 1, like the FLOP counts (formats/ops/flops.h).
#pragma once

#include "formats/ops/flops.h"

namespace kiln::bytes {

/// Elements x element size of a value (half a byte each for the 4-bit types); 0 for an absent one.
inline CheckedInt value(const Graph& g, ValueId id) {
  if (id == kNoValue) return 0;
  const Value& v = g.value(id);
  const CheckedInt numel = flops::numel_or_one(v.shape);
  if (is_int4(v.dtype)) return (numel + 1) / 2;
  return numel * static_cast<int64_t>(dtype_size(v.dtype));
}

/// The bytes of the node's inputs from `first` on.
inline CheckedInt inputs(const Node& n, const Graph& g, size_t first = 0) {
  CheckedInt sum = 0;
  for (size_t i = first; i < n.inputs.size(); ++i) sum += value(g, n.inputs[i]);
  return sum;
}

inline CheckedInt outputs(const Node& n, const Graph& g) {
  CheckedInt sum = 0;
  for (ValueId id : n.outputs) sum += value(g, id);
  return sum;
}

/// The default (an op without OpTraits::bytes): every present input read once, every output
/// written once. Right for the ops that read all of their inputs, which is most of them.
inline int64_t moved(const Node& n, const Graph& g) { return flops::saturate(inputs(n, g) + outputs(n, g)); }

/// Ops that copy a selection of input 0 (Gather, Slice, Compress): they read about as much of
/// the data as they write, and never more than all of it; their other inputs (indices, starts,
/// a condition) are read in full. Counting the whole data would make an embedding lookup read
/// its whole table.
inline int64_t selection(const Node& n, const Graph& g) {
  const CheckedInt written = outputs(n, g);
  const CheckedInt data = n.inputs.empty() ? CheckedInt(0) : value(g, n.inputs[0]);
  // An overflowed count stands for "huge": the other one is the smaller.
  const CheckedInt read = !data.ok() ? written : !written.ok() ? data : data.value() < written.value() ? data : written;
  return flops::saturate(read + inputs(n, g, 1) + written);
}

/// Ops that read only their input's shape, never its data (Shape, Size, EyeLike): the output.
inline int64_t output_only(const Node& n, const Graph& g) { return flops::saturate(outputs(n, g)); }

}  // namespace kiln::bytes
