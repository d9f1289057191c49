// convert (PT2E's convert_pt2e): the calibrated groups become explicit QuantizeLinear /
// DequantizeLinear core ops with their scales and zero points as constants. A quantized output
// gets one QuantizeLinear and one DequantizeLinear per reader; a quantized input edge reads a
// Q → DQ of its value; a constant weight is stored quantized (i8) and read through its
// DequantizeLinear. The ops in between stay float until `kiln compile` lowers the Q/DQ patterns
// it has int8 kernels for.
#pragma once

#include "formats/ir.h"
#include "quant/prepare.h"

namespace kiln::quant {

/// A group's scale and zero point: its observer's, its fixed ones, or (derived) the product of
/// the scales it derives from with zero point 0.
QParams group_qparams(const Prepared& prepared, size_t group);

struct ConvertStats {
  size_t quantize_nodes = 0;
  size_t dequantize_nodes = 0;
  size_t quantized_weights = 0;  ///< constants stored quantized
  size_t dynamic_quantize_nodes = 0;  ///< DynamicQuantizeLinear (dynamic specs)
};

/// Rewrites `model` (the graph prepared and calibrated) and marks it quantized. The float
/// weights it replaced are left unread (`kiln compile`'s eliminate_dead drops them). A dynamic
/// input edge reads DequantizeLinear(DynamicQuantizeLinear(value)): u8, its scale and zero
/// point computed from each run's data.
Result<ConvertStats> convert(Model& model, const Prepared& prepared);

}  // namespace kiln::quant
