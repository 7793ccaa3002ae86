// Pattern: the one regex engine for names from models (pattern.h).
#include "util/pattern.h"

#include <re2/re2.h>

#include "lopper/error.h"

namespace lopper {

namespace {

// NOTE: Latin-1, so that a pattern sees a name's bytes as std::regex did (invalid UTF-8 in a
// model's names still matches `.`); errors come back as values, never printed by RE2 itself.
RE2::Options options() {
  RE2::Options o;
  o.set_encoding(RE2::Options::EncodingLatin1);
  o.set_log_errors(false);
  o.set_max_mem(int64_t(64) << 20);  // a long alternation of names (Python's constants) compiles
  return o;
}

}  // namespace

Pattern::Pattern(const std::string& re, const std::string& what)
    : re_(std::make_shared<const RE2>(re, options())), pattern_(re) {
  if (!re_->ok())
    throw Error("[prune] \x1e" + what + "\x1f '" + re + "' is not a valid regex: " + re_->error());
}

bool Pattern::search(std::string_view s) const {
  return RE2::PartialMatch(re2::StringPiece(s.data(), s.size()), *re_);
}

bool Pattern::full_match(std::string_view s) const {
  return RE2::FullMatch(re2::StringPiece(s.data(), s.size()), *re_);
}

std::vector<std::string> Pattern::find_all(std::string_view s) const {
  std::vector<std::string> out;
  re2::StringPiece rest(s.data(), s.size());
  const int groups = re_->NumberOfCapturingGroups();
  re2::StringPiece m[2];
  size_t at = 0;
  while (at <= rest.size() &&
         re_->Match(rest, at, rest.size(), RE2::UNANCHORED, m, groups > 0 ? 2 : 1)) {
    out.emplace_back(m[groups > 0 ? 1 : 0]);
    const size_t end = size_t(m[0].data() + m[0].size() - rest.data());
    at = end > at ? end : at + 1;  // an empty match moves on by one
  }
  return out;
}

std::string Pattern::quote(std::string_view s) {
  return RE2::QuoteMeta(re2::StringPiece(s.data(), s.size()));
}

std::string Pattern::error_of(const std::string& re) {
  const RE2 r(re, options());
  return r.ok() ? "" : r.error();
}

}  // namespace lopper
