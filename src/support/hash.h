// Content hashing for caches and packages: SHA-256 through OpenSSL's libcrypto.
//
//   std::string key = sha256_hex(source);
//   KeyHasher h;                       // a length-prefixed record of named fields
//   h.field("source", src); h.field("flag", "-O3");
//   std::string key2 = h.hex_digest();
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

// SHA-256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // 64 lowercase hex digits; the hasher cannot be updated afterwards.
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SHA-256 of sixteen messages at once, one per 32-bit lane of AVX-512 (Note [SHA-256 of sixteen
// messages at once] in sha256_x16.cc): what a package's loader hashes its weights' chunks with,
// where this CPU has AVX-512 (about twice OpenSSL's single-stream SHA-NI rate here).
class Sha256x16 {
 public:
  // Whether this CPU runs it (AVX-512 F and BW); else every call below fails an assertion.
  static bool available();
  Sha256x16();  // every lane at SHA-256's initial state
  // Hashes the next `blocks` 64-byte blocks of every lane: lane l's from lanes[l] on. All
  // sixteen pointers must be readable for blocks * 64 bytes (a caller with fewer messages points
  // the spare lanes at one of its own).
  void update(const char* const lanes[16], size_t blocks);
  // Ends every lane as a message of `bytes` bytes (what update() took: a multiple of 64) and
  // writes each lane's raw 32-byte digest.
  void finish(uint64_t bytes, unsigned char digests[16][32]);

 private:
  alignas(64) uint32_t state_[8][16];
};

// A hashed record of named fields: each is written as "tag:length:value\n", so field boundaries
// are unambiguous (source "a" + flag "b" never collides with source "ab").
class KeyHasher {
 public:
  KeyHasher& field(std::string_view tag, std::string_view value);
  std::string hex_digest() { return sha_.hex_digest(); }

 private:
  Sha256 sha_;
};

}  // namespace kiln
