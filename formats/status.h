// Error values shared by every kiln library: nothing below cli/ prints or exits; functions
// return Status or Result<T>, and cli/ turns an Error into one line on stderr and an exit code.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kiln {

/// What kind of failure an Error is; the values are kiln's exit codes.
enum class ErrorKind { internal = 1, user = 2, check = 3 };

/// One failure: `<file>: <where>: <what>`, empty parts left out.
struct Error {
  ErrorKind kind = ErrorKind::user;
  std::string file;   ///< the file the failure is about, if any
  std::string where;  ///< node or value, e.g. "node 'conv_3'", if any
  std::string what;   ///< lower-case sentence with concrete values, no trailing period

  std::string message() const;
};

/// Success, or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : error_(std::make_unique<Error>(std::move(e))) {}  // NOLINT: implicit by design
  Status(const Status& o) : error_(o.error_ ? std::make_unique<Error>(*o.error_) : nullptr) {}
  Status(Status&&) noexcept = default;
  Status& operator=(const Status& o) {
    error_ = o.error_ ? std::make_unique<Error>(*o.error_) : nullptr;
    return *this;
  }
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return error_ == nullptr; }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }
  Error& error() { return *error_; }

 private:
  std::unique_ptr<Error> error_;
};

/// A value, or an Error.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}            // NOLINT: implicit by design
  Result(Error e) : v_(std::move(e)) {}        // NOLINT
  Result(Status s) : v_(std::move(s.error())) {}  // NOLINT: only from a failed Status

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }
  Error& error() { return std::get<1>(v_); }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

/// A user error (exit code 2).
Error user_error(std::string where, std::string what);
/// An internal error (exit code 1): a kiln bug, not the user's input.
Error internal_error(std::string where, std::string what);

/// `text` with every control character (below 0x20, and 0x7f) written as `\xNN`: names and
/// paths from a file, printed to a terminal, cannot move the cursor, clear the screen, retitle
/// the window or break a line. Error messages use it; so does every human-readable listing.
std::string escape_controls(std::string_view text);

/// Sets `file` on an error that has none yet; returns the status for chaining.
Status with_file(Status s, const std::string& file);

}  // namespace kiln

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

/// Returns the Status of `expr` from the enclosing function if it failed.
#define KILN_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::kiln::Status kiln_status_ = (expr);           \
    if (!kiln_status_.ok()) return kiln_status_;    \
  } while (0)

/// `KILN_ASSIGN_OR_RETURN(auto x, f())`: unwraps a Result or returns its Error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_result_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp.error());     \
  lhs = std::move(tmp).value()
