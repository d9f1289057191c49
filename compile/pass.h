// The pass interface and THE pass table. A pass is a function that rewrites a Model in place
// and says what it changed; all_passes() lists every pass in default pipeline order, so that
// `--passes`, `--print-after`, `--time-passes`, `--list-passes` and the docs come from one place.
// Each pass lives in its own file under compile/passes/.
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>

#include "formats/ir.h"
#include "formats/status.h"
#include "runtime/target.h"

namespace kiln {

struct TuningOptions;

/// What every pass sees besides the model: the machine compiled for and the user's choices.
struct PassContext {
  const Target& target;
  /// --input-shape NAME=1x3x224x224: concrete shapes for graph inputs (specialize_shapes).
  std::map<std::string, Shape> input_shapes;
  /// --mode max-autotune and --tuning-db (autotune_kernels, compile/autotune.h); null: neither.
  const TuningOptions* tuning = nullptr;
  /// --precision: f32, or bf16 / f16 for lower_precision to lower to.
  DType precision = DType::f32;
  /// --lower-output-layers: lower_precision lowers the layers that write graph outputs too.
  bool lower_output_layers = false;
};

/// What a pass did: `changed` is false when it left the model exactly as it was; the summary
/// says what it changed in a few words ("folded 3 BatchNormalization into Conv").
struct PassResult {
  bool changed = false;
  std::string summary;
};

/// A pass. User errors (a bad --input-shape) and internal errors come back as an Error; a pass
/// that fails may have changed the model, which the pipeline then discards.
using PassFn = Result<PassResult> (*)(Model&, PassContext&);

/// One row of the pass table.
struct PassInfo {
  std::string_view name;     ///< CLI name, e.g. "fold_constants"
  std::string_view summary;  ///< one line for --list-passes and the README
  PassFn run;
};

/// Every pass, in default pipeline order.
std::span<const PassInfo> all_passes();
/// The pass of this name, or null.
const PassInfo* find_pass(std::string_view name);

// The passes (compile/passes/<name>.cc).
Result<PassResult> specialize_shapes(Model& model, PassContext& ctx);
Result<PassResult> fold_constants(Model& model, PassContext& ctx);
Result<PassResult> eliminate_common_subexpressions(Model& model, PassContext& ctx);
Result<PassResult> fold_batchnorm(Model& model, PassContext& ctx);
Result<PassResult> drop_linear_reshapes(Model& model, PassContext& ctx);
Result<PassResult> fuse_linear_bias(Model& model, PassContext& ctx);
Result<PassResult> fuse_layer_norm_pass(Model& model, PassContext& ctx);
Result<PassResult> fuse_rms_norm_pass(Model& model, PassContext& ctx);
Result<PassResult> fuse_gelu_pass(Model& model, PassContext& ctx);
Result<PassResult> fuse_rotary_pass(Model& model, PassContext& ctx);
Result<PassResult> fuse_attention_pass(Model& model, PassContext& ctx);
Result<PassResult> hoist_activations(Model& model, PassContext& ctx);
Result<PassResult> fuse_epilogues_pass(Model& model, PassContext& ctx);
Result<PassResult> gather_rows_early(Model& model, PassContext& ctx);
Result<PassResult> channels_last(Model& model, PassContext& ctx);
Result<PassResult> lower_int8(Model& model, PassContext& ctx);
Result<PassResult> lower_precision(Model& model, PassContext& ctx);
Result<PassResult> merge_projections(Model& model, PassContext& ctx);
Result<PassResult> merge_transposes(Model& model, PassContext& ctx);
Result<PassResult> fold_split_concat(Model& model, PassContext& ctx);
Result<PassResult> fuse_concat(Model& model, PassContext& ctx);
Result<PassResult> fuse_pointwise_depthwise(Model& model, PassContext& ctx);
Result<PassResult> fuse_channel_scale(Model& model, PassContext& ctx);
Result<PassResult> eliminate_dead(Model& model, PassContext& ctx);
Result<PassResult> select_kernels(Model& model, PassContext& ctx);
Result<PassResult> autotune_kernels(Model& model, PassContext& ctx);
Result<PassResult> prepack_weights(Model& model, PassContext& ctx);

}  // namespace kiln
