// Shared by the libFuzzer targets: the memory budget every target runs under, an empty folder
// for anything a loader might resolve relative to the input, and the rule that a failure must
// be a user error. An internal error, an escaping exception or a sanitizer report is a finding.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "formats/memory.h"
#include "formats/status.h"

namespace kiln::fuzz {

/// The budget targets run under: what `--max-memory 256MiB` gives a user.
inline constexpr size_t kMemoryLimit = size_t{256} << 20;

/// Called once from LLVMFuzzerInitialize.
inline void init() { set_memory_limit(kMemoryLimit); }

/// An empty folder private to this process (sidecars and external data resolve here), removed
/// when the process exits normally (libFuzzer's end of -max_total_time or -runs).
inline const std::string& empty_dir() {
  struct Dir {
    std::string path = (std::filesystem::temp_directory_path() / ("kiln-fuzz-" + std::to_string(getpid()))).string();
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

/// Aborts (a finding) when an error is not the user's.
inline void require_user_error(const Error& e) {
  if (e.kind == ErrorKind::user || e.kind == ErrorKind::check) return;
  std::fprintf(stderr, "kiln fuzz: internal error: %s\n", e.message().c_str());
  std::abort();
}

template <class R>
void check(const R& r) {
  if (!r.ok()) require_user_error(r.error());
}

/// Runs `body`, turning escaping exceptions into findings with a readable message.
template <class F>
void guarded(F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln fuzz: exception escaped: %s\n", e.what());
    std::abort();
  }
}

}  // namespace kiln::fuzz
