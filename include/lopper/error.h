// lopper's two kinds of failure: user/model errors (lopper::Error, one line naming the thing) and
// internal bugs (LOPPER_ASSERT, InternalError). The CLI maps Error to exit code 1 (UsageError 2)
// and InternalError to 3.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lopper {

/// `text` with each option name marked by LOPPER_OPTION given as `name(option)` (nullptr: the
/// name itself).
inline std::string render_options(const std::string& text,
                                  std::string (*name)(const std::string&) = nullptr) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t end = text[i] == '\x1e' ? text.find('\x1f', i) : std::string::npos;
    if (end == std::string::npos) {
      out += text[i];
      continue;
    }
    const std::string option = text.substr(i + 1, end - i - 1);
    out += name ? name(option) : option;
    i = end;
  }
  return out;
}

/// A problem with the user's input: a model, a file, an option. `what()` is one line that starts
/// with the place in brackets, e.g. "[import] node 'Conv_12': unsupported op 'Foo'".
/// NOTE: the library names its options as its structs spell them ("round_to must be >= 1"), each
/// marked in the message with LOPPER_OPTION; what() shows the names, and the CLI renders each as
/// its flag ("--round-to must be >= 1"), so that only the CLI speaks of flags.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(render_options(msg)), text_(msg) {}
  /// The message with each marked option given as `name(option)` (the CLI: its flag).
  std::string render(std::string (*name)(const std::string&)) const {
    return render_options(text_, name);
  }

 private:
  std::string text_;
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

/// Marks an option's name in an Error's message: "[prune] " LOPPER_OPTION("round_to") " ...".
#define LOPPER_OPTION(name) "\x1e" name "\x1f"

/// An internal invariant: failing it is a lopper bug, not a user mistake.
#define LOPPER_ASSERT(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond))                                                                  \
      ::lopper::detail::assert_fail(#cond, __FILE__, __LINE__,                    \
                                    ::lopper::detail::concat("", ##__VA_ARGS__)); \
  } while (0)
