// What `kiln inspect` reports about a model: op histogram, parameters, FLOPs, bytes moved, I/O
// shapes, stage and provenance. Symbolic or unknown dims count as 1 (batch 1) in FLOPs and bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "formats/ir.h"

namespace kiln {

struct ModelSummary {
  std::map<std::string, int64_t> op_counts;  ///< qualified op → nodes
  int64_t nodes = 0;
  int64_t parameters = 0;       ///< elements of constant values
  int64_t parameter_bytes = 0;
  int64_t flops = 0;            ///< the nodes' node_flops: every core op's OpTraits::flops
  int64_t bytes = 0;            ///< the nodes' node_bytes: memory their kernels read and write
};

ModelSummary summarize(const Model& model);

/// FLOPs of one node by its op's OpTraits::flops (0 for ops outside the core set), symbolic
/// dims as 1.
int64_t node_flops(const Node& node, const Graph& graph);

/// Bytes one node's kernel reads and writes by its op's OpTraits::bytes (bytes::moved, every
/// input and output once, for ops that set none and for ops outside the core set), symbolic
/// dims as 1.
int64_t node_bytes(const Node& node, const Graph& graph);

/// The `kiln inspect --json` document (schema "kiln.inspect", version 1).
std::string summary_json(const Model& model, const ModelSummary& s);

}  // namespace kiln
