// The row kernels built for AVX2 with FMA; CMake sets the flags for this file.
#define KILN_CPU_ISA avx2
#include "runtime/cpu/rows.inc"
