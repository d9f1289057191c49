// Error formatting.
#include "formats/status.h"

namespace kiln {

namespace {

// At most this many characters of any one part of a message: values quoted from a hostile file
// (names, lists, shapes) must not turn the one-line error into megabytes.
constexpr size_t kMaxPartChars = 400;

// The part with control characters escaped (a message is one line) and the middle elided when
// it is too long.
std::string printable_part(const std::string& part) {
  std::string out = escape_controls(part);
  if (out.size() <= kMaxPartChars) return out;
  size_t head = kMaxPartChars * 2 / 3, tail = kMaxPartChars - head;
  // Cut at byte boundaries that do not split a UTF-8 sequence.
  while (head > 0 && (static_cast<unsigned char>(out[head]) & 0xC0) == 0x80) --head;
  size_t from = out.size() - tail;
  while (from < out.size() && (static_cast<unsigned char>(out[from]) & 0xC0) == 0x80) ++from;
  return out.substr(0, head) + " [... " + std::to_string(from - head) + " characters ...] " + out.substr(from);
}

}  // namespace

std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string Error::message() const {
  std::string out;
  for (const std::string* part : {&file, &where, &what}) {
    if (part->empty()) continue;
    if (!out.empty()) out += ": ";
    out += printable_part(*part);
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
