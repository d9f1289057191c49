// Error formatting.
#include "formats/status.h"

namespace kiln {

std::string Error::message() const {
  std::string out;
  for (const std::string* part : {&file, &where, &what}) {
    if (part->empty()) continue;
    if (!out.empty()) out += ": ";
    out += *part;
  }
  if (kind == ErrorKind::internal) out += " (internal error: please report this as a kiln bug)";
  return out;
}

Error user_error(std::string where, std::string what) {
  return Error{ErrorKind::user, {}, std::move(where), std::move(what)};
}

Error internal_error(std::string where, std::string what) {
  return Error{ErrorKind::internal, {}, std::move(where), std::move(what)};
}

Status with_file(Status s, const std::string& file) {
  if (!s.ok() && s.error().file.empty()) s.error().file = file;
  return s;
}

}  // namespace kiln
