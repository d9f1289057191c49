// `kiln export`: ONNX model → kiln Model of core ops.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "formats/ir.h"

namespace kiln {

struct ExportOptions {
  /// --input-shape NAME=1x3x224x224: replaces the declared shape of a graph input.
  std::map<std::string, Shape> input_shapes;
  /// The command line, recorded in the model's provenance.
  std::string command_line;
  /// Unsupported-op errors list every node name, not only counts.
  bool verbose = false;
};

/// Exports an ONNX file. Errors carry the file name; unsupported ops are reported together,
/// grouped by op type with counts.
Result<Model> export_onnx(const std::string& path, const ExportOptions& options = {});
/// Same, from what `fd` holds from where it stands (`-`: stdin), parsed as it is read and named
/// `display_name` in errors; external data resolves against `model_dir`. Does not close `fd`.
Result<Model> export_onnx_fd(int fd, const std::string& display_name, const std::string& model_dir,
                             const ExportOptions& options = {});
/// Same, from serialized bytes; external data resolves against `model_dir`.
Result<Model> export_onnx_bytes(const std::string& bytes, const std::string& display_name,
                                const std::string& model_dir, const ExportOptions& options = {});

/// Parses a shape such as "1x3x224x224" or "batchx128" (symbolic dims by name, "?" unknown).
Result<Shape> parse_shape(const std::string& text);

/// One line per supported ONNX op: "Conv  1-22" ("domain::Op" outside the default domain).
std::vector<std::string> supported_onnx_ops();

}  // namespace kiln
