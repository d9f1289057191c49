// The first n of 16 lanes as an AVX-512 mask (none for n <= 0, all for n >= 16): a row's or a
// panel's last columns for the masked loads and stores of the files built with AVX-512.
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

#include <cstdint>

namespace kiln::cpu {
namespace {  // each including file's own copy: they are built for different ISAs

inline __mmask16 lanes16(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1); }

}  // namespace
}  // namespace kiln::cpu
#endif
