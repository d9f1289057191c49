// `kiln compile`'s driver: runs the chosen passes in order, verifies the graph after each,
// times them, and records the compile in the model's provenance.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "compile/autotune.h"
#include "compile/pass.h"
#include "formats/ir.h"
#include "runtime/target.h"

namespace kiln {

/// What one pass did.
struct PassRecord {
  std::string name;
  PassResult result;
  double ms = 0;          ///< wall time of the pass, verification excluded
  bool has_text = false;  ///< text_after was captured (the pass is in print_after and changed the model)
  std::string text_after;
};

struct CompileOptions {
  /// Pass names to run, in this order; empty runs all_passes() in table order.
  std::vector<std::string> passes;
  /// --input-shape NAME=1x3x224x224 (specialize_shapes).
  std::map<std::string, Shape> input_shapes;
  /// The machine compiled for (--threads sets its thread count, which kernel choice sizes
  /// its kernels by).
  Target target;
  /// --mode max-autotune, --tuning-db, --tune-budget (the autotune_kernels pass).
  TuningOptions tuning;
  /// --precision: f32 (fp32), bf16 or f16 (fp16) (the lower_precision pass).
  DType precision = DType::f32;
  /// --lower-output-layers: the layers that write graph outputs lowered too (their outputs f32).
  bool lower_output_layers = false;
  /// Passes after which to capture the model's text form (PassRecord::text_after); "all" for every pass.
  std::set<std::string> print_after;
  /// Called after each pass with its record (the CLI prints --print-after dumps as they come,
  /// so that the passes before a failing one still show). May be empty.
  std::function<void(const PassRecord&)> after_pass;

  // The provenance entry the compile appends.
  std::string command_line;  ///< the whole command line
  std::string input_file;    ///< file name of the input model (no folders)
  std::string input_sha256;  ///< hex SHA-256 of the input file
};

struct CompileReport {
  std::vector<PassRecord> passes;
};

/// Checks the pass names (an unknown one is a user error listing the known passes) and whether
/// every name in print_after is a known pass or "all".
Status check_pass_names(const CompileOptions& options);

/// Why `--precision` (bf16 or f16) will not make the model faster on this CPU, if it will not,
/// for compile to warn: bf16 without AMX where the probed bf16 peak (`peaks`, the ceilings'
/// compute_gflops; empty when not probed: then nothing is said) is at most f32's; where the CPU
/// has AVX512-FP16 and its probed f16 peak is above f32's, the warning says that fp16 can be.
/// (f16 needs a target with AVX512-FP16, which kiln.gemm_f16_avx512 multiplies on.)
std::optional<std::string> precision_speed_warning(DType precision, const CpuFeatures& cpu, const std::map<std::string, double>& peaks);

/// Runs the passes on `model` and marks it compiled. After each pass the graph is verified
/// (formats/verify.h); a pass that leaves an invalid graph is an internal error naming the
/// pass. On error the model may be half-rewritten: callers write nothing.
Result<CompileReport> compile_model(Model& model, const CompileOptions& options);

}  // namespace kiln
