// .kiln bytes → load (FlatBuffers verifier and the loader's structural checks alone, then with
// kiln's semantic verification), and what `kiln inspect` does with a verified model: the
// summary, its JSON and the text form.
#include <cstddef>
#include <cstdint>

#include "formats/serialize.h"
#include "formats/summary.h"
#include "formats/text.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    for (bool verify : {true, false}) {
      kiln::LoadOptions options;
      options.verify = verify;
      auto model = kiln::load_model_from_bytes({data, size}, "fuzz.kiln", options, kiln::fuzz::empty_dir());
      kiln::fuzz::check(model);
      // Without verification only the loader's memory-safety checks ran: indices may be out of
      // range, which is what `inspect` never sees (it always verifies).
      if (!model.ok() || !verify) continue;
      kiln::ModelSummary s = kiln::summarize(*model);
      (void)kiln::summary_json(*model, s);
      (void)kiln::model_to_text(*model);
    }
  });
  return 0;
}
