#include "compiler/target.h"

#include <mutex>

#include "core/error.h"

namespace kiln::compiler {

namespace {
struct TargetRegistry {
  std::mutex mu;
  std::vector<const Target*> targets;
};
TargetRegistry& registry() {
  static TargetRegistry* r = new TargetRegistry();  // never destroyed: targets are static
  return *r;
}
}  // namespace

void register_target(const Target* target) {
  KILN_ASSERT(target != nullptr);
  TargetRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.targets.push_back(target);
}

const Target& target_for(Device device) {
  TargetRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Target* t : r.targets)
    if (t->device().type == device.type) return *t;
  std::string names;
  for (const Target* t : r.targets) names += (names.empty() ? "" : ", ") + std::string(t->name());
  fail("compiler: no target compiles for {} (registered targets: {}); compile for another "
       "device or link the target's library",
       device.str(), names.empty() ? "none" : names);
}

std::vector<const Target*> registered_targets() {
  TargetRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.targets;
}

}  // namespace kiln::compiler
