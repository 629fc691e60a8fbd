// The content-addressed on-disk cache of compiled kernels (CPU shared objects, CUDA cubins).
// See Note [Artifact cache] in artifact_cache.cc.
//
//   ArtifactCache cache("cpu", "so", 1);        // <cache_dir>/cpu/<key[0:2]>/<key>.so + .meta
//   std::string bytes;
//   if (!cache.validate(key, &existed, &bytes)) cache.put(key, compile(...), {{"unit", name}});
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class ArtifactCache {
 public:
  using Fields = std::vector<std::pair<std::string, std::string>>;

  // `kind` names the folder under cache_dir() and the meta header ("kiln-<kind>-cache V");
  // `ext` is the artifact's extension without the dot ("so", "cubin").
  ArtifactCache(std::string kind, std::string ext, int format_version);

  struct Paths {
    std::string dir, artifact, meta;
  };
  // Paths of the entry for `key` (64 hex digits) under the current cache_dir().
  Paths paths(const std::string& key) const;

  // True when the entry is complete: its meta parses, names `key`, and the artifact has exactly
  // the recorded size and SHA-256. *existed tells whether any file of the entry is there (an
  // invalid existing entry is corrupt and must be rebuilt). `bytes`, when given, receives the
  // artifact's bytes (read once, for the check).
  bool validate(const std::string& key, bool* existed, std::string* bytes = nullptr) const;

  // A fresh temp path "<dir>/<key>.tmp.<unique><suffix>" in the entry's directory (created;
  // temp files older than a day are removed first).
  std::string temp_path(const std::string& key, const std::string& suffix) const;

  // Publishes `tmp_artifact` (a complete file in the entry's directory whose content is
  // `artifact_bytes`) as the entry for `key`: the artifact is fsynced and renamed into place
  // first, then the meta (key, size, SHA-256, then `fields` in order), so a reader never sees a
  // meta before the bytes it describes. Throws kiln::Error naming the path on failure (temp
  // files removed).
  void publish(const std::string& key, const std::string& tmp_artifact,
               std::string_view artifact_bytes, const Fields& fields) const;
  // The same for bytes in memory.
  void put(const std::string& key, std::string_view artifact_bytes, const Fields& fields) const;

  // <cache_dir>/<kind>/failed: sources of failed compiles are kept there for bug reports.
  std::string failed_dir() const;
  const std::string& kind() const { return kind_; }

 private:
  std::string meta_text(const std::string& key, std::string_view bytes, const Fields& f) const;
  std::string kind_, ext_;
  int version_;
};

}  // namespace kiln
