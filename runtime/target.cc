#include "runtime/target.h"

#include <algorithm>

#include <cpuid.h>
#include <cpuinfo.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace kiln {

namespace {

// Linux: AMX tile data is off until a process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool os_grants_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  if (!cpuinfo_initialize()) return f;
  f.avx2 = cpuinfo_has_x86_avx2();
  f.fma = cpuinfo_has_x86_fma3();
  // kiln's AVX-512 builds use DQ too (the sigmoid family's vreduceps): every CPU with BW and VL
  // has it (Skylake-SP onward, Zen 4); the Xeon Phis, which lack all three, run the AVX2 kernels.
  f.avx512f = cpuinfo_has_x86_avx512f() && cpuinfo_has_x86_avx512dq();
  f.avx512bw = cpuinfo_has_x86_avx512bw();
  f.avx512vl = cpuinfo_has_x86_avx512vl();
  f.avx512_vnni = cpuinfo_has_x86_avx512vnni();
  f.avx512_bf16 = cpuinfo_has_x86_avx512bf16();
  // AVX512-FP16 and AMX postdate Debian 12's cpuinfo: CPUID leaf 7 EDX bits 23 (AVX512-FP16),
  // 22, 24 and 25 (AMX-BF16, AMX-TILE, AMX-INT8); AMX also needs XCR0's tile bits 17 and 18.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.avx512_fp16 = f.avx512f && (edx >> 23 & 1);
    const bool amx_cpu = (edx >> 22 & 1) && (edx >> 24 & 1) && (edx >> 25 & 1);
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    if (amx_cpu) {
      __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
      f.amx = (xcr0_lo >> 17 & 1) && (xcr0_lo >> 18 & 1) && os_grants_amx();
    }
  }
  return f;
}

}  // namespace

const CpuFeatures& CpuFeatures::host() {
  static const CpuFeatures features = detect();
  return features;
}

namespace {

// Every feature with its name, in the order names() lists them.
constexpr std::pair<bool CpuFeatures::*, std::string_view> kFeatures[] = {
    {&CpuFeatures::avx2, "avx2"},
    {&CpuFeatures::fma, "fma"},
    {&CpuFeatures::avx512f, "avx512f"},
    {&CpuFeatures::avx512bw, "avx512bw"},
    {&CpuFeatures::avx512vl, "avx512vl"},
    {&CpuFeatures::avx512_vnni, "avx512-vnni"},
    {&CpuFeatures::avx512_bf16, "avx512-bf16"},
    {&CpuFeatures::avx512_fp16, "avx512-fp16"},
    {&CpuFeatures::amx, "amx"},
};

}  // namespace

std::vector<std::string> CpuFeatures::names() const {
  std::vector<std::string> out;
  for (const auto& [member, name] : kFeatures)
    if (this->*member) out.emplace_back(name);
  return out;
}

std::string CpuFeatures::str() const {
  std::string s;
  for (const std::string& name : names()) s += (s.empty() ? "" : " ") + name;
  return s.empty() ? "baseline" : s;
}

std::vector<std::string> CpuFeatures::missing(const std::vector<std::string>& required) const {
  std::vector<std::string> have = names(), out;
  for (const std::string& r : required)
    if (std::find(have.begin(), have.end(), r) == have.end()) out.push_back(r);
  return out;
}

std::optional<CpuFeatures> CpuFeatures::named(std::string_view name) {
  if (name == "host") return host();
  CpuFeatures f;
  if (name != "avx2" && name != "avx512" && name != "avx512-vnni" && name != "avx512-bf16" && name != "avx512-fp16" && name != "amx")
    return std::nullopt;
  f.avx2 = f.fma = true;
  if (name == "avx2") return f;
  f.avx512f = f.avx512bw = f.avx512vl = true;
  if (name == "avx512") return f;
  f.avx512_vnni = true;
  if (name == "avx512-vnni") return f;
  f.avx512_bf16 = true;
  if (name == "avx512-bf16") return f;
  f.avx512_fp16 = true;
  if (name == "avx512-fp16") return f;
  f.amx = true;
  return f;
}

}  // namespace kiln
