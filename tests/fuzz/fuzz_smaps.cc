// Bytes → page_use (formats/huge_pages.h), the reader of /proc/self/smaps that `kiln profile`
// and `kiln run -v` tell the model file's and its buffers' 2 MiB pages by (model_page_use).
// The first 16 bytes pick one address range; whatever the text, no mapping counts more in part
// of the address space than in all of it, and no ranges count nothing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "formats/huge_pages.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    uintptr_t bounds[2] = {0, 0};
    const size_t head = std::min(size, sizeof bounds);
    std::memcpy(bounds, data, head);
    const std::string_view smaps(reinterpret_cast<const char*>(data) + head, size - head);
    const auto [first, last] = std::minmax(bounds[0], bounds[1]);
    const kiln::PageUse part = kiln::page_use(smaps, {{first, last}});
    const kiln::PageUse all = kiln::page_use(smaps, {{0, UINTPTR_MAX}});
    const kiln::PageUse none = kiln::page_use(smaps, {});
    if (part.resident_bytes > all.resident_bytes || part.huge_page_bytes > all.huge_page_bytes) std::abort();
    if (none.resident_bytes != 0 || none.huge_page_bytes != 0) std::abort();
  });
  return 0;
}
