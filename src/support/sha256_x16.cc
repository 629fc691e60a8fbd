// Note [SHA-256 of sixteen messages at once]
// A package's weights section is hashed in 4 MiB chunks (Note [chunked weights hash] in
// runtime/package.cc), and that hash was most of a CPU package's load: OpenSSL's SHA-256 runs
// one message at a time at 1.41 GB/s per core on this session's Xeon (with its SHA extensions),
// so bert_base's 437 MB took 310 ms of CPU on a 2-core machine. The chunks are independent
// messages of the same length, which is the case SIMD suits: each 32-bit lane of a 512-bit
// register carries one message's state through FIPS 180-4's rounds, so one instruction advances
// sixteen messages. AVX-512 has the operations the rounds need as single instructions: rotates
// (vprord) and any three-input boolean function (vpternlogd: Ch = 0xCA, Maj = 0xE8, the
// three-way XORs of the Sigma functions = 0x96). A lane's words are gathered from its own
// message (64-bit addresses, so the messages may lie anywhere) and byte-swapped to big-endian.
// Every lane's result is the SHA-256 of its message, bit for bit (tests compare with OpenSSL on
// random messages). Written from the standard; only for messages of whole 64-byte blocks, all
// of one length (the chunks), since their padding block is then the same for every lane.
#include "support/hash.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace kiln {

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
constexpr uint32_t kInitial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

#if defined(__x86_64__)
#define KILN_X16 __attribute__((target("avx512f,avx512bw")))

// Lane l's 32-bit word at byte `at` of each lane's block, big-endian: two gathers of eight
// 64-bit addresses each.
KILN_X16 inline __m512i load_words(__m512i addr_lo, __m512i addr_hi, int64_t at, __m512i bswap) {
  const __m512i d = _mm512_set1_epi64(at);
  const __m256i lo = _mm512_i64gather_epi32(_mm512_add_epi64(addr_lo, d), nullptr, 1);
  const __m256i hi = _mm512_i64gather_epi32(_mm512_add_epi64(addr_hi, d), nullptr, 1);
  return _mm512_shuffle_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), bswap);
}

// `blocks` 64-byte blocks of every lane, lane l's from lanes[l] (`stride` 64: consecutive blocks;
// 0: the same block every time, the shared padding block).
KILN_X16 void compress(uint32_t (*state)[16], const char* const lanes[16], size_t blocks,
                       int64_t stride) {
  const __m512i bswap = _mm512_set4_epi32(0x0c0d0e0f, 0x08090a0b, 0x04050607, 0x00010203);
  alignas(64) int64_t addr[16];
  for (int l = 0; l < 16; ++l) addr[l] = int64_t(reinterpret_cast<uintptr_t>(lanes[l]));
  __m512i lo = _mm512_load_si512(addr), hi = _mm512_load_si512(addr + 8);
  const __m512i step = _mm512_set1_epi64(stride);
  __m512i s[8];
  for (int i = 0; i < 8; ++i) s[i] = _mm512_load_si512(state[i]);
  for (size_t blk = 0; blk < blocks; ++blk) {
    __m512i w[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) w[i] = load_words(lo, hi, 4 * i, bswap);
    __m512i a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
#pragma GCC unroll 64
    for (int t = 0; t < 64; ++t) {
      __m512i wt = w[t & 15];
      if (t >= 16) {  // the message schedule, in place over the last 16 words
        const __m512i x15 = w[(t - 15) & 15], x2 = w[(t - 2) & 15];
        const __m512i s0 = _mm512_ternarylogic_epi32(_mm512_ror_epi32(x15, 7), _mm512_ror_epi32(x15, 18),
                                                     _mm512_srli_epi32(x15, 3), 0x96);
        const __m512i s1 = _mm512_ternarylogic_epi32(_mm512_ror_epi32(x2, 17), _mm512_ror_epi32(x2, 19),
                                                     _mm512_srli_epi32(x2, 10), 0x96);
        wt = _mm512_add_epi32(_mm512_add_epi32(wt, s0), _mm512_add_epi32(w[(t - 7) & 15], s1));
        w[t & 15] = wt;
      }
      const __m512i S1 = _mm512_ternarylogic_epi32(_mm512_ror_epi32(e, 6), _mm512_ror_epi32(e, 11),
                                                   _mm512_ror_epi32(e, 25), 0x96);
      const __m512i ch = _mm512_ternarylogic_epi32(e, f, g, 0xCA);
      const __m512i t1 = _mm512_add_epi32(
          _mm512_add_epi32(h, S1),
          _mm512_add_epi32(ch, _mm512_add_epi32(wt, _mm512_set1_epi32(int(kRound[t])))));
      const __m512i S0 = _mm512_ternarylogic_epi32(_mm512_ror_epi32(a, 2), _mm512_ror_epi32(a, 13),
                                                   _mm512_ror_epi32(a, 22), 0x96);
      const __m512i t2 = _mm512_add_epi32(S0, _mm512_ternarylogic_epi32(a, b, c, 0xE8));
      h = g;
      g = f;
      f = e;
      e = _mm512_add_epi32(d, t1);
      d = c;
      c = b;
      b = a;
      a = _mm512_add_epi32(t1, t2);
    }
    s[0] = _mm512_add_epi32(s[0], a);
    s[1] = _mm512_add_epi32(s[1], b);
    s[2] = _mm512_add_epi32(s[2], c);
    s[3] = _mm512_add_epi32(s[3], d);
    s[4] = _mm512_add_epi32(s[4], e);
    s[5] = _mm512_add_epi32(s[5], f);
    s[6] = _mm512_add_epi32(s[6], g);
    s[7] = _mm512_add_epi32(s[7], h);
    lo = _mm512_add_epi64(lo, step);
    hi = _mm512_add_epi64(hi, step);
  }
  for (int i = 0; i < 8; ++i) _mm512_store_si512(state[i], s[i]);
}
#endif

}  // namespace

bool Sha256x16::available() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return yes;
#else
  return false;
#endif
}

Sha256x16::Sha256x16() {
  for (int i = 0; i < 8; ++i)
    for (int l = 0; l < 16; ++l) state_[i][l] = kInitial[i];
}

void Sha256x16::update(const char* const lanes[16], size_t blocks) {
  KILN_ASSERT(available());
#if defined(__x86_64__)
  compress(state_, lanes, blocks, 64);
#endif
}

void Sha256x16::finish(uint64_t bytes, unsigned char digests[16][32]) {
  KILN_ASSERT(available() && bytes % 64 == 0);
#if defined(__x86_64__)
  // The padding of a whole number of blocks is one block: 0x80, zeros, the length in bits.
  alignas(64) char pad[64] = {};
  pad[0] = char(0x80);
  const uint64_t bits = bytes * 8;
  for (int i = 0; i < 8; ++i) pad[63 - i] = char(bits >> (8 * i));
  const char* lanes[16];
  for (const char*& p : lanes) p = pad;
  compress(state_, lanes, 1, 0);
#endif
  for (int l = 0; l < 16; ++l)
    for (int i = 0; i < 8; ++i)
      for (int k = 0; k < 4; ++k) digests[l][4 * i + k] = static_cast<unsigned char>(state_[i][l] >> (24 - 8 * k));
}

}  // namespace kiln
