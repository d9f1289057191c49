// The inputs of a model run, shared by `kiln run` and `kiln profile`: arrays from files
// (--input NAME=FILE.npy|.pb, --inputs F.npz or an ONNX test_data_set folder) and random ones
// for the rest (--input-shape NAME=1x128 shapes them, --seed seeds them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "formats/npy.h"

namespace CLI {
class App;
}

namespace kiln::cli {

struct InputArgs {
  std::vector<std::string> inputs;  ///< --input NAME=FILE (repeatable)
  std::string inputs_file;          ///< --inputs F.npz or a test_data_set folder
  std::vector<std::string> input_shapes;
  uint64_t seed = 0;
};

/// Adds --input, --inputs, --input-shape and --seed to `cmd`.
void add_input_options(CLI::App* cmd, InputArgs& args);

/// The graph's inputs in graph.inputs order: the given arrays, and random ones within each
/// input's valid range for the others. Symbolic dims bound by the given inputs and the
/// --input-shape ones size the other random inputs; any others are 1.
Result<std::vector<Tensor>> gather_inputs(const Graph& g, const InputArgs& args, const std::string& model_file);

/// The input_K.pb / output_K.pb files of an ONNX test_data_set folder, by K.
std::vector<std::string> numbered_pb_files(const std::string& dir, const std::string& prefix);

/// Tensors from a test_data_set folder's numbered .pb files, named by the graph's values at
/// those positions (the files' own names when they match a value).
Result<NamedTensors> read_pb_set(const std::string& dir, const std::string& prefix, const std::vector<std::string>& names);

}  // namespace kiln::cli
