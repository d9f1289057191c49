// Where kernels run, and what the CPU they run on can do. Read at run time (cpuinfo, CPUID),
// never taken from the build machine: a kiln built here runs on CPUs with and without AVX-512.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// The instruction-set features kernels dispatch on. Each is set only when the CPU has it and
/// the operating system saves its registers (for AMX: grants its tile state too).
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;  ///< with AVX512-DQ, which kiln's AVX-512 builds use too (vreduceps)
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx = false;  ///< AMX-TILE with AMX-BF16 and AMX-INT8

  /// This machine's CPU, read once.
  static const CpuFeatures& host();
  /// A CPU to compile for (`kiln compile --target`): "host" (this one), "avx2" (AVX2 + FMA),
  /// "avx512" (that + AVX-512 F/BW/VL/DQ), "avx512-vnni" (that + VNNI), "avx512-bf16" (that +
  /// AVX512-BF16), "avx512-fp16" (that + AVX512-FP16), "amx" (that + AMX: a Xeon since Sapphire
  /// Rapids); nullopt for other names.
  static std::optional<CpuFeatures> named(std::string_view name);
  /// The names of the features it has, in a fixed order: "avx2", "fma", "avx512f",
  /// "avx512bw", "avx512vl", "avx512-vnni", "avx512-bf16", "avx512-fp16", "amx".
  std::vector<std::string> names() const;
  /// names() joined by spaces; "baseline" for none.
  std::string str() const;
  /// The features of `required` (by name) this CPU lacks.
  std::vector<std::string> missing(const std::vector<std::string>& required) const;
};

/// Where a kernel runs: the device, its CPU features and how many threads kernels may use.
struct Target {
  std::string device = "cpu";
  CpuFeatures cpu = CpuFeatures::host();
  int threads = 1;
};

}  // namespace kiln
