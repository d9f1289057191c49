// What /proc says of this process, for tests of its memory: a mapping's flags (what asks for huge
// pages), its resident set and that set's peak (what a reader holds at once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace kiln {

/// The VMA flags of the mapping holding `p` (/proc/self/smaps' VmFlags line: " hg" where it
/// asked for huge pages, " nh" where it asked for none), "" if none does.
inline std::string vm_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) inside = lo <= at && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

/// A line of /proc/self/status in kB ("VmRSS:" now, "VmHWM:" its peak since reset_peak_rss), 0 if
/// there is none.
inline size_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + std::strlen(key), nullptr, 10);
  return 0;
}

/// Resets VmHWM to the RSS now (Linux 4.0+); false where it cannot.
inline bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

}  // namespace kiln
