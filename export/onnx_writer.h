// kiln → ONNX: `kiln quant ... -o OUT.onnx` writes the quantized model as a standard ONNX model
// in QDQ form (QuantizeLinear / DequantizeLinear around float ops), which ONNX Runtime and
// OpenVINO run on their int8 kernels.
#pragma once

#include <string>

#include "formats/ir.h"
#include "formats/status.h"

namespace kiln {

/// The serialized ModelProto (IR 10, opset 21, or the newest op's opset when a node needs a
/// later one) of an exported or quantized model: each node as the ONNX op of its name,
/// constants as initializers, dtype-name attributes as ONNX enums. A user error for what ONNX
/// cannot hold: compile's fused ops, packed weights, subgraphs (not written yet).
Result<std::string> write_onnx(const Model& model);

}  // namespace kiln
