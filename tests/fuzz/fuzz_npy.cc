// .npy bytes → read_npy, and a read-back: what parses must serialize and parse to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "formats/npy.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    auto t = kiln::read_npy({data, size}, "fuzz.npy");
    kiln::fuzz::check(t);
    if (!t.ok()) return;
    std::vector<uint8_t> again = kiln::write_npy(*t);
    auto back = kiln::read_npy(again, "again.npy");
    if (!back.ok() || kiln::write_npy(*back) != again) std::abort();
  });
  return 0;
}
