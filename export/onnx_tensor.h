// ONNX TensorProto ↔ kiln Tensor: initializers, Constant values, and the test_data_set_N/*.pb
// files of ONNX test cases.
#pragma once

#include <string>

#include "formats/dtype.h"
#include "formats/tensor.h"
#include "formats/status.h"

namespace onnx {
class TensorProto;
}

namespace kiln {

/// TensorProto.DataType's UINT4 and INT4 (ONNX 1.16; the installed protobuf headers predate
/// them).
inline constexpr int kOnnxUint4 = 21;
inline constexpr int kOnnxInt4 = 22;

/// kiln dtype of an ONNX TensorProto.DataType, or nullopt for types kiln does not support
/// (strings, complex, 4/8-bit floats, 2-bit integers).
std::optional<DType> dtype_from_onnx(int onnx_type);
/// The same, plus the 4-bit integer types, which kiln stores (tensors, values, QuantizeLinear's
/// output type) but computes on only through DequantizeLinear.
std::optional<DType> value_dtype_from_onnx(int onnx_type);
/// ONNX TensorProto.DataType name ("FLOAT8E4M3FN") for messages.
std::string onnx_type_name(int onnx_type);

/// Converts a TensorProto. External data is read relative to `model_dir`, and refused when the
/// path is absolute, has "..", or resolves outside that folder; `model_dir` empty refuses all.
Result<Tensor> tensor_from_onnx(const onnx::TensorProto& t, const std::string& model_dir);

/// Reads a serialized TensorProto file (input_0.pb) and returns its name and tensor.
Result<std::pair<std::string, Tensor>> read_onnx_tensor_file(const std::string& path);

}  // namespace kiln
