// Bytes → the tuning database's reader (compile/tuning_db.h). A refusal must be a user error that
// names a line; whatever is accepted must round-trip: its canonical file reads back as the same
// database, writes the same bytes again, and merging it with itself changes nothing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "compile/tuning_db.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    auto db = kiln::tuning::parse_tuning_db(text, "db.jsonl");
    kiln::fuzz::check(db);
    if (!db.ok()) {
      if (db.error().file != "db.jsonl" || db.error().where.rfind("line ", 0) != 0) std::abort();
      return;
    }
    const std::string canonical = db->serialize();
    auto again = kiln::tuning::parse_tuning_db(canonical, "canonical.jsonl");
    if (!again.ok() || !(*again == *db) || again->serialize() != canonical) std::abort();
    kiln::tuning::TuningDb doubled = *db;
    doubled.merge(*db);
    if (doubled.serialize() != canonical) std::abort();
    for (const kiln::tuning::TuningRecord* r : db->records())
      if (db->lookup(r->problem, r->machine, r->versions) != r) std::abort();
  });
  return 0;
}
