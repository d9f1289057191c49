// The GEMM micro-kernels and blocking loops built for AVX-512 (F, BW, VL) with FMA; CMake sets
// the flags for this file.
#define KILN_CPU_ISA avx512
#define KILN_GEMM_AVX512 1
#include "runtime/cpu/gemm/gemm.inc"
