// ONNX bytes → export (protobuf parse, op-version resolution, arity checks, converters, shape
// inference, verification), in memory: nothing is written, and external data resolves in an
// empty folder. A model that exports is also serialized and loaded back.
#include <cstddef>
#include <cstdint>
#include <string>

#include "export/exporter.h"
#include "formats/serialize.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    std::string bytes(reinterpret_cast<const char*>(data), size);
    auto model = kiln::export_onnx_bytes(bytes, "fuzz.onnx", kiln::fuzz::empty_dir());
    kiln::fuzz::check(model);
    if (!model.ok()) return;
    auto out = kiln::serialize_model(*model);
    if (!out.ok()) kiln::fuzz::require_user_error(out.error());
    else kiln::fuzz::check(kiln::load_model_from_bytes(*out, "exported.kiln"));
  });
  return 0;
}
