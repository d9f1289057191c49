// Bytes → `kiln profile --compare`'s baseline reader, then a comparison of what it read with
// itself and with a copy slowed by half: every path of compare_profiles and its two renderings
// runs on whatever the reader accepts. A reader error must be the user's.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "profile/compare.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    auto base = kiln::profile::read_profile_samples(std::string_view(reinterpret_cast<const char*>(data), size), "base.json");
    kiln::fuzz::check(base);
    if (!base.ok()) return;
    kiln::profile::ProfileSamples slower = *base;
    for (double& x : slower.iteration_ms) x *= 1.5;
    for (auto& n : slower.nodes)
      for (double& x : n.times_us) x *= 1.5;
    kiln::profile::CompareOptions options;
    options.per_kernel = true;
    for (const auto* now : {&*base, &slower}) {
      const kiln::profile::Comparison c = kiln::profile::compare_profiles(*base, *now, options);
      // Identical samples can never be a significant change.
      if (now == &*base && (c.end_to_end.significant || c.failed)) std::abort();
      (void)kiln::profile::to_json(c, options, "base.json").dump();
      (void)kiln::profile::render_comparison(c, options, "base.json");
    }
  });
  return 0;
}
