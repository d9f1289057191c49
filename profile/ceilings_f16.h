// The ceilings probe's AVX512-FP16 loop, in its own file (ceilings_f16.cc) because it is built
// with -mavx512fp16: clang 14 knows the f16 vector types only with the flag, not through a
// function's target attribute.
#pragma once

namespace kiln::profile {

/// 16 independent `vfmadd231ph` chains (32 f16 multiply-adds each) `iters` times; call it only
/// on a CPU with AVX512-FP16. Returns a sum of the lanes, so that the work is kept.
float f16_fma_loop(long iters);

}  // namespace kiln::profile
