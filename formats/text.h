// The text form of a model (`kiln inspect --text`): deterministic and diffable, one line per
// value and per node, subgraphs indented under the node that holds them.
#pragma once

#include <string>

#include "formats/ir.h"

namespace kiln {

/// Renders `model` as text. The format, one item per line:
///
///   model stage=exported
///   provenance tool="kiln export" version="0.1.0" input="m.onnx" sha256="…" command="…"
///   metadata "producer" = "pytorch"
///   target device="cpu" isa=["avx2", "fma"] threads=2
///   memory_plan inputs=[1x3x224x224] arena=25690112 workspace=0 values=52
///   graph
///     input x: f32[batch,3,224,224]
///     const w: f32[64,3,7,7] crc32=1a2b3c4d data=[0.5, -1, 2, 0.25, ...]
///     value y: u8[batch,64,?,?] quant=u8 scales=[0.1] zero_points=[128]
///     node conv_3: Conv(x, w, _) -> (y) group=1 strides=ints[1, 1] sources=["conv"] kernel=onednn.conv{tile=8}
///     node if_1: If(c) -> (z) then_branch=<graph> captures=[w]
///       attr then_branch:
///         graph
///           capture w: f32[64,3,7,7]
///           ...
///     output y
///
/// Values are listed in graph order (inputs first, marked `input`; constants `const`; a
/// subgraph's stand-ins for captured values `capture`; the rest `value`), then nodes in order,
/// then graph outputs. Names made only of letters, digits and
/// `_ . : / -` are printed bare, others quoted with C escapes; omitted inputs print as `_`.
/// Attributes print by name in stored order; lists carry their type (`ints[...]`, `floats[...]`,
/// `strings[...]`) so that empty lists stay typed, floats always show a point or exponent.
/// Constants print their dtype, shape, CRC-32 of their bytes and up to the first 8 elements
/// (`tensor=` before them when the data's dtype or shape differs from the value's).
/// The function never fails: out-of-range indices print as `%<index>?`.
std::string model_to_text(const Model& model);

/// An attribute's value as the text form writes it: `3`, `0.5`, `"relu"`, `ints[1, 1]`.
std::string attribute_text(const AttrValue& value);

/// A node's kernel choice as the text form writes it: `kiln.gemm_f32_avx512{mr=8, nr=48, ...}`.
std::string kernel_choice_text(const KernelChoice& kernel);

/// The text form of one graph at the given indentation (two spaces per level).
std::string graph_to_text(const Graph& graph, int indent = 0);

}  // namespace kiln
