// The kernel's flags for a mapping of this process, for tests of what asks for huge pages.
#pragma once

#include <cstdint>
#include <cstdio>
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

}  // namespace kiln
