// SHA-256 (FIPS 180-4): portable rounds, and the x86 SHA extensions' where the CPU has them.
// kiln compile and kiln quant hash the whole input file for its provenance: BERT-base's 438 MB
// took 1.6 of the compile's 4.8 s in the portable rounds (260 MB/s), 0.4 s on the extensions.
#include "formats/sha256.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdio>

namespace kiln {

namespace {

constexpr std::array<uint32_t, 64> kRound = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void block(std::array<uint32_t, 8>& h, const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void portable_blocks(std::array<uint32_t, 8>& h, const uint8_t* p, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i) block(h, p + 64 * i);
}

// The SHA extensions' rounds: `sha256rnds2` does two rounds on the state held as ABEF and CDGH,
// `sha256msg1` / `sha256msg2` extend the message schedule four words at a time (Intel's
// "Intel SHA Extensions" paper, 2013).
__attribute__((target("sha,sse4.1"))) void sha_ni_blocks(std::array<uint32_t, 8>& h, const uint8_t* p,
                                                          size_t blocks) {
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);  // big-endian words
  __m128i cdab = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0])), 0xB1);
  __m128i cdgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4])), 0x1B);  // HGFE
  __m128i abef = _mm_alignr_epi8(cdab, cdgh, 8);
  cdgh = _mm_blend_epi16(cdgh, cdab, 0xF0);
  for (size_t b = 0; b < blocks; ++b, p += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];  // the schedule's last 16 words, 4 a vector: W[4g..4g+3] in w[g % 4]
    for (int g = 0; g < 4; ++g)
      w[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), swap);
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      const __m128i kw = _mm_add_epi32(w[g % 4], _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kRound[4 * g])));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, kw);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(kw, 0x0E));
      if (g < 12) {  // W[4g + 16..]: from W[4g..4g + 15]
        const __m128i& w1 = w[(g + 1) % 4], &w2 = w[(g + 2) % 4], &w3 = w[(g + 3) % 4];
        const __m128i sum = _mm_add_epi32(_mm_sha256msg1_epu32(w[g % 4], w1), _mm_alignr_epi8(w3, w2, 4));
        w[g % 4] = _mm_sha256msg2_epu32(sum, w3);
      }
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), _mm_blend_epi16(feba, dchg, 0xF0));  // DCBA: h0..h3
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), _mm_alignr_epi8(dchg, feba, 8));     // HGFE: h4..h7
}

using Blocks = void (*)(std::array<uint32_t, 8>&, const uint8_t*, size_t);

constexpr std::array<uint32_t, 8> kInitial = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

// The digest of `total` bytes whose whole blocks have gone into `h`, `rest` (under 64) left over.
std::string finish(std::array<uint32_t, 8>& h, const uint8_t* rest, size_t rest_size, uint64_t total, Blocks blocks) {
  uint8_t tail[128] = {};
  for (size_t i = 0; i < rest_size; ++i) tail[i] = rest[i];
  tail[rest_size] = 0x80;
  size_t len = rest_size + 9 <= 64 ? 64 : 128;
  uint64_t bits = total * 8;
  for (int i = 0; i < 8; ++i) tail[len - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  blocks(h, tail, len / 64);
  std::string out;
  char buf[9];
  for (uint32_t x : h) {
    std::snprintf(buf, sizeof buf, "%08x", x);
    out += buf;
  }
  return out;
}

std::string hex_digest(std::span<const uint8_t> bytes, Blocks blocks) {
  std::array<uint32_t, 8> h = kInitial;
  size_t full = bytes.size() / 64 * 64;
  blocks(h, bytes.data(), full / 64);
  return finish(h, bytes.data() + full, bytes.size() - full, bytes.size(), blocks);
}

// Whether the CPU has the SHA extensions (CPUID leaf 7's EBX) and SSE4.1 (leaf 1's ECX), which
// their code uses too. (Clang's __builtin_cpu_supports knows no "sha".)
bool has_sha_extensions() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1)) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
  }();
  return has;
}

Blocks best_blocks() { return has_sha_extensions() ? sha_ni_blocks : portable_blocks; }

}  // namespace

std::string sha256_hex(std::span<const uint8_t> bytes) { return hex_digest(bytes, best_blocks()); }

std::string sha256_hex_portable(std::span<const uint8_t> bytes) { return hex_digest(bytes, portable_blocks); }

Sha256::Sha256() : h_(kInitial) {}

void Sha256::update(std::span<const uint8_t> bytes) {
  total_ += bytes.size();
  if (pending_size_ > 0) {
    const size_t take = std::min(bytes.size(), sizeof pending_ - pending_size_);
    std::copy_n(bytes.data(), take, pending_ + pending_size_);
    pending_size_ += take;
    bytes = bytes.subspan(take);
    if (pending_size_ < sizeof pending_) return;
    best_blocks()(h_, pending_, 1);
    pending_size_ = 0;
  }
  const size_t full = bytes.size() / 64 * 64;
  if (full > 0) best_blocks()(h_, bytes.data(), full / 64);
  std::copy(bytes.begin() + static_cast<std::ptrdiff_t>(full), bytes.end(), pending_);
  pending_size_ = bytes.size() - full;
}

std::string Sha256::hex() { return finish(h_, pending_, pending_size_, total_, best_blocks()); }

}  // namespace kiln
