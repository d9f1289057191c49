// ONNX converters of the control family. If, Loop and Scan (opset 9+) map one to one: the
// exporter converts their body attributes into kiln subgraphs (with the bodies' nodes already
// inferred), and outer-scope values stay references by name. Scan-8 (batched, with
// sequence_lens) has other semantics and is not registered; sequence-typed bodies are refused by
// the exporter because kiln has tensors only.
#include "export/converter.h"

namespace kiln {

void register_control_converters(ConverterRegistry& r) {
  r.add("If", 1, 25, convert_passthrough);
  r.add("Loop", 1, 25, convert_passthrough);
  r.add("Scan", 9, 25, convert_passthrough);
}

}  // namespace kiln
