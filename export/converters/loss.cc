// ONNX converters of the loss ops. NegativeLogLikelihoodLoss 12, 13 and 22 and
// SoftmaxCrossEntropyLoss 12 and 13 differ only in the types they allow, so every version maps
// one to one onto the core op of the same name.
#include "export/converter.h"

namespace kiln {

void register_loss_converters(ConverterRegistry& r) {
  r.add("NegativeLogLikelihoodLoss", 12, 22, convert_passthrough);
  r.add("SoftmaxCrossEntropyLoss", 12, 13, convert_passthrough);
}

}  // namespace kiln
