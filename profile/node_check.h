// `kiln profile --check` and `--bitwise`: every node's chosen kernel against its reference
// kernel on the inputs the node really saw, and two runs against each other bit for bit; and
// the one-node models that `kiln run --node` runs to reproduce a node on its saved inputs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "runtime/session.h"

namespace kiln::profile {

/// A model of node `index` of `model` alone: its non-constant inputs become graph inputs (of
/// `shapes` where given, in the node's input order, else as declared), its constant inputs stay
/// constants (packed ones too), its outputs are the graph outputs, and it keeps its kernel
/// choice, the model's stage and target. Nodes with subgraphs (If, Loop, Scan) are refused.
Result<Model> single_node_model(const Model& model, size_t index, const std::vector<std::vector<int64_t>>* shapes = nullptr);

/// The node's index by name; a user error naming `file` when the model has none of that name.
Result<size_t> find_node(const Model& model, const std::string& name, const std::string& file);

struct CheckOptions {
  double tolerance = 1e-4;       ///< relative L2 error a float output of an f32 kernel may have
  double low_precision_tolerance = 1e-2;  ///< for kernels that compute in bf16 or int8
  std::string repro_dir;         ///< where a failing node's inputs go (<dir>/<node>.npz)
  std::string model_file;        ///< for the repro line
};

struct NodeCheck {
  size_t index = 0;
  std::string name, op, kernel;
  bool checked = false;   ///< false: skipped (`why` says why)
  std::string why;
  double rel_l2 = 0;      ///< worst over the node's outputs: ‖fast − ref‖₂ / ‖ref‖₂
  double max_abs = 0;     ///< worst absolute difference
  double tolerance = 0;
  bool pass = true;
  std::string detail;     ///< the worst output's comparison summary, when it failed
  std::string repro;      ///< the command that reproduces a failing node
};

/// One run of `session` on `inputs` with every top-level node re-run on its reference kernel
/// right after its own kernel, on the same inputs. Failing nodes' non-constant inputs are
/// written to options.repro_dir.
Result<std::vector<NodeCheck>> check_nodes(Session& session, const Model& model, const std::vector<Tensor>& inputs,
                                           const CheckOptions& options);

/// Two runs, every node's outputs hashed: the first node whose outputs differ between them
/// (nodes run in order, so that is where nondeterminism enters), and whether the graph
/// outputs differ.
struct BitwiseCheck {
  bool identical = true;
  std::string first_node;  ///< empty when every node matched
  std::string first_kernel;
  std::vector<std::string> outputs_differ;  ///< graph outputs whose bytes differ
};
Result<BitwiseCheck> check_bitwise(Session& session, const std::vector<Tensor>& inputs);

nlohmann::ordered_json to_json(const std::vector<NodeCheck>& checks, const CheckOptions& options);
nlohmann::ordered_json to_json(const BitwiseCheck& b);

}  // namespace kiln::profile
