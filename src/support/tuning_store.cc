#include "support/tuning_store.h"

#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "support/files.h"
#include "support/hash.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {
constexpr int kTuningFormatVersion = 1;

std::string tuning_path(const std::string& key) {
  return (fs::path(cache_dir()) / "tuning" / (sha256_hex(key) + ".rec")).string();
}
}  // namespace

bool tuning_get(const std::string& key, std::string* value) {
  std::string text;
  if (!read_whole_file(tuning_path(key), &text)) return false;
  // Layout: body, then "sha256 <64 hex digits of body>\n". The body is parsed strictly by its
  // lengths: any truncation or flipped byte reads as absent.
  constexpr size_t kTrailer = 7 + 64 + 1;
  if (text.size() < kTrailer || text.back() != '\n') return false;
  const size_t sha_at = text.size() - kTrailer;
  if (text.compare(sha_at, 7, "sha256 ") != 0) return false;
  const std::string body = text.substr(0, sha_at);
  if (text.compare(sha_at + 7, 64, sha256_hex(body)) != 0) return false;
  const std::string header =
      fmt::format("kiln-tuning {}\nkey {}\n", kTuningFormatVersion, key.size());
  if (body.compare(0, header.size(), header) != 0) return false;
  size_t pos = header.size();
  if (body.size() < pos + key.size() + 1 || body.compare(pos, key.size(), key) != 0 ||
      body[pos + key.size()] != '\n')
    return false;
  pos += key.size() + 1;
  if (body.compare(pos, 6, "value ") != 0) return false;
  pos += 6;
  const size_t nl = body.find('\n', pos);
  if (nl == std::string::npos) return false;
  size_t value_size = 0;
  for (size_t i = pos; i < nl; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(body[i]))) return false;
    value_size = value_size * 10 + static_cast<size_t>(body[i] - '0');
  }
  pos = nl + 1;
  if (body.size() != pos + value_size + 1 || body.back() != '\n') return false;
  *value = body.substr(pos, value_size);
  return true;
}

void tuning_put(const std::string& key, const std::string& value) {
  const std::string path = tuning_path(key);
  make_dirs(fs::path(path).parent_path().string());
  const std::string body = fmt::format("kiln-tuning {}\nkey {}\n{}\nvalue {}\n{}\n",
                                       kTuningFormatVersion, key.size(), key, value.size(), value);
  write_file_atomic(path, body + "sha256 " + sha256_hex(body) + "\n");
}

}  // namespace kiln
