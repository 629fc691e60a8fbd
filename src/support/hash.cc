#include "support/hash.h"

#include <openssl/evp.h>

#include <fmt/format.h>

#include "core/error.h"

namespace kiln {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
  bool done = false;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1)
    throw_error(ErrorKind::Internal, "sha256: OpenSSL could not initialize a SHA-256 digest");
}

Sha256::~Sha256() {
  if (impl_->ctx) EVP_MD_CTX_free(impl_->ctx);
}

void Sha256::update(const void* data, size_t n) {
  KILN_ASSERT(!impl_->done);
  if (n > 0 && EVP_DigestUpdate(impl_->ctx, data, n) != 1)
    throw_error(ErrorKind::Internal, "sha256: OpenSSL digest update failed");
}

std::string Sha256::hex_digest() {
  KILN_ASSERT(!impl_->done);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, md, &len) != 1 || len != 32)
    throw_error(ErrorKind::Internal, "sha256: OpenSSL digest final failed");
  impl_->done = true;
  static const char* digits = "0123456789abcdef";
  std::string hex(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 0xf];
  }
  return hex;
}

std::string sha256_hex(std::string_view data) {
  Sha256 sha;
  sha.update(data);
  return sha.hex_digest();
}

KeyHasher& KeyHasher::field(std::string_view tag, std::string_view value) {
  sha_.update(fmt::format("{}:{}:", tag, value.size()));
  sha_.update(value);
  sha_.update("\n");
  return *this;
}

}  // namespace kiln
