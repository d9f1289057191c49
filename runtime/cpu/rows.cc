// Choosing a row-kernel build by the target's CPU features (rows.h).
#include "runtime/cpu/rows.h"

namespace kiln::cpu {

namespace avx512 {
extern const RowKernels kRowKernels;
}
namespace avx2 {
extern const RowKernels kRowKernels;
}

std::optional<Isa> best_isa(const CpuFeatures& cpu) {
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.fma) return Isa::avx512;
  if (cpu.avx2 && cpu.fma) return Isa::avx2;
  return std::nullopt;
}

const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512" : "avx2"; }

std::optional<std::string> lacks(const CpuFeatures& cpu, Isa isa) {
  if (best_isa(cpu) && *best_isa(cpu) >= isa) return std::nullopt;
  return std::string("the CPU lacks ") + isa_name(isa);
}

CpuFeatures isa_features(Isa isa) { return *CpuFeatures::named(isa == Isa::avx512 ? "avx512" : "avx2"); }

const RowKernels& row_kernels(Isa isa) { return isa == Isa::avx512 ? avx512::kRowKernels : avx2::kRowKernels; }

}  // namespace kiln::cpu
