// Content hashing for caches and packages: SHA-256 through OpenSSL's libcrypto.
//
//   std::string key = sha256_hex(source);
//   KeyHasher h;                       // a length-prefixed record of named fields
//   h.field("source", src); h.field("flag", "-O3");
//   std::string key2 = h.hex_digest();
#pragma once
#include <cstddef>
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
