// The row kernels built for AVX-512 (F, BW, VL) with FMA; CMake sets the flags for this file.
#define KILN_CPU_ISA avx512
#include "runtime/cpu/rows.inc"
