// .npz bytes → read_npz (zip container, then each member's .npy), and read_tensors, which tells
// .npy from .npz by content.
#include <cstddef>
#include <cstdint>

#include "formats/npy.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    kiln::fuzz::check(kiln::read_npz({data, size}, "fuzz.npz"));
    kiln::fuzz::check(kiln::read_tensors({data, size}, "fuzz", "x"));
  });
  return 0;
}
