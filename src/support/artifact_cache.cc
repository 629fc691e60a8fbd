// Note [Artifact cache]
// Entries are immutable and named by a content key (SHA-256 over everything that determines the
// artifact: source, compiler and version, flags, target ISA or architecture). An entry is
// <cache_dir>/<kind>/<key[0:2]>/<key>.<ext> plus <key>.meta, a small text file:
//     kiln-<kind>-cache <version>
//     key <key>
//     <ext>_bytes <size>
//     <ext>_sha256 <hash of the artifact bytes>
//     <field> <value>          (unit, compile_seconds, compiler, ... as the producer gives them)
// A lookup accepts the artifact only if the meta parses, names this key and the bytes have
// exactly the recorded size and hash; anything else (a missing meta, a truncated or bit-flipped
// artifact) is rebuilt, so an invalid file is never loaded. Writers produce the artifact in a
// temp file in the entry's own directory, fsync it, rename it into place, then write and rename
// the meta and fsync the directory: readers see no entry, a complete entry, or an artifact
// whose meta is not there yet (treated as missing). Two processes racing on one key both end
// with a valid entry (the producers are deterministic for a key).
#include "support/artifact_cache.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "support/files.h"
#include "support/hash.h"

namespace kiln {

namespace fs = std::filesystem;

ArtifactCache::ArtifactCache(std::string kind, std::string ext, int format_version)
    : kind_(std::move(kind)), ext_(std::move(ext)), version_(format_version) {}

ArtifactCache::Paths ArtifactCache::paths(const std::string& key) const {
  Paths p;
  fs::path dir = fs::path(cache_dir()) / kind_ / key.substr(0, 2);
  p.dir = dir.string();
  p.artifact = (dir / (key + "." + ext_)).string();
  p.meta = (dir / (key + ".meta")).string();
  return p;
}

std::string ArtifactCache::failed_dir() const {
  return (fs::path(cache_dir()) / kind_ / "failed").string();
}

namespace {
// Reads `name value` lines of a meta file whose first line must be `header`.
bool parse_meta(const std::string& text, const std::string& header,
                std::unordered_map<std::string, std::string>* fields) {
  size_t pos = 0;
  bool first = true;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) return false;  // truncated: every line ends with '\n'
    const std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    if (first) {
      if (line != header) return false;
      first = false;
      continue;
    }
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) return false;
    (*fields)[std::string(line.substr(0, sp))] = std::string(line.substr(sp + 1));
  }
  return !first;
}
}  // namespace

std::string ArtifactCache::meta_text(const std::string& key, std::string_view bytes,
                                     const Fields& f) const {
  std::string s = fmt::format("kiln-{}-cache {}\nkey {}\n{}_bytes {}\n{}_sha256 {}\n", kind_,
                              version_, key, ext_, bytes.size(), ext_, sha256_hex(bytes));
  for (const auto& [name, value] : f) s += name + " " + value + "\n";
  return s;
}

bool ArtifactCache::validate(const std::string& key, bool* existed, std::string* bytes) const {
  const Paths p = paths(key);
  std::error_code ec;
  *existed = fs::exists(p.artifact, ec) || fs::exists(p.meta, ec);
  if (!*existed) return false;
  std::string meta;
  if (!read_whole_file(p.meta, &meta)) return false;
  std::unordered_map<std::string, std::string> fields;
  if (!parse_meta(meta, fmt::format("kiln-{}-cache {}", kind_, version_), &fields)) return false;
  if (fields["key"] != key) return false;
  std::string data;
  if (!read_whole_file(p.artifact, &data)) return false;
  if (fields[ext_ + "_bytes"] != std::to_string(data.size())) return false;
  if (fields[ext_ + "_sha256"] != sha256_hex(data)) return false;
  if (bytes) *bytes = std::move(data);
  return true;
}

std::string ArtifactCache::temp_path(const std::string& key, const std::string& suffix) const {
  const Paths p = paths(key);
  make_dirs(p.dir);
  remove_stale_temps(p.dir);
  return (fs::path(p.dir) / (key + ".tmp." + unique_suffix() + suffix)).string();
}

void ArtifactCache::publish(const std::string& key, const std::string& tmp_artifact,
                            std::string_view artifact_bytes, const Fields& fields) const {
  const Paths p = paths(key);
  const std::string tmp_meta = tmp_artifact + ".meta";
  try {
    fsync_path(tmp_artifact);
    write_file(tmp_meta, meta_text(key, artifact_bytes, fields), /*sync=*/true);
    // The artifact first: a meta is never visible before the bytes it describes.
    if (::rename(tmp_artifact.c_str(), p.artifact.c_str()) != 0 ||
        ::rename(tmp_meta.c_str(), p.meta.c_str()) != 0)
      fail_kind(ErrorKind::Runtime, "cannot move '{}' into the kernel cache at '{}': {}",
                tmp_artifact, p.artifact, errno_text(errno));
  } catch (...) {
    remove_quietly(tmp_artifact);
    remove_quietly(tmp_meta);
    throw;
  }
  fsync_path(p.dir);
}

void ArtifactCache::put(const std::string& key, std::string_view artifact_bytes,
                        const Fields& fields) const {
  const std::string tmp = temp_path(key, "." + ext_);
  try {
    write_file(tmp, artifact_bytes, /*sync=*/false);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
  publish(key, tmp, artifact_bytes, fields);
}

}  // namespace kiln
