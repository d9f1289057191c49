// The GEMM micro-kernels and blocking loops built for AVX2 with FMA; CMake sets the flags for
// this file.
#define KILN_CPU_ISA avx2
#define KILN_GEMM_AVX512 0
#include "runtime/cpu/gemm/gemm.inc"
