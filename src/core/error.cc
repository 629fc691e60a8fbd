#include "core/error.h"

namespace kiln {
void throw_error(ErrorKind kind, std::string message) { throw Error(kind, std::move(message)); }
}  // namespace kiln
