// lopper's two kinds of failure: user/model errors (lopper::Error, one line naming the thing) and
// internal bugs (LOPPER_ASSERT, InternalError). The CLI maps Error to exit code 1 (UsageError 2)
// and InternalError to 3.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lopper {

/// A problem with the user's input: a model, a file, a flag. `what()` is one line that starts with
/// the place in brackets, e.g. "[import] node 'Conv_12': unsupported op 'Foo'".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// A usage mistake on the command line (exit code 2).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg) {}
};

/// A lopper bug (a failed LOPPER_ASSERT), never the user's mistake: the CLI says so and exits 3.
/// Deliberately not a lopper::Error, so that nothing handling user errors can swallow it.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace lopper

/// Throws lopper::Error with the message pieces concatenated when `cond` is false.
#define LOPPER_CHECK(cond, ...)                                                \
  do {                                                                         \
    if (!(cond)) throw ::lopper::Error(::lopper::detail::concat(__VA_ARGS__)); \
  } while (0)

/// An internal invariant: failing it is a lopper bug, not a user mistake.
#define LOPPER_ASSERT(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond))                                                                  \
      ::lopper::detail::assert_fail(#cond, __FILE__, __LINE__,                    \
                                    ::lopper::detail::concat("", ##__VA_ARGS__)); \
  } while (0)
