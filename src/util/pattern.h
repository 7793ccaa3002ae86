// Patterns users write (--exclude, recipe `match`, --freeze, Python's exclude=), matched against
// names from untrusted models: RE2, whose time is linear in the name and whose stack does not grow
// with it (std::regex recursed per character: a 200,000-character name crashed it, `(a+)+z` never
// ended). Internal; RE2 stays out of this header.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace re2 {
class RE2;
}

namespace lopper {

/// A compiled pattern: ECMAScript/Perl syntax as users write it (classes, groups, `(?:...)`,
/// anchors, \d \w \s, counted repeats), minus what no linear-time engine has (backreferences,
/// lookaround), matched byte by byte. Copies share the compiled program; thread-safe to match.
class Pattern {
 public:
  /// Compiles `re`; throws lopper::Error "[prune] WHAT 'RE' is not a valid regex: WHY" naming the
  /// option `what` (marked as an option for the front ends' names).
  Pattern(const std::string& re, const std::string& what);
  /// Whether the pattern is found anywhere in `s` (as std::regex_search).
  bool search(std::string_view s) const;
  /// Whether the pattern matches the whole of `s` (as std::regex_match).
  bool full_match(std::string_view s) const;
  /// The first group of each match in `s`, left to right, matches not overlapping (the whole
  /// match when the pattern has no group).
  std::vector<std::string> find_all(std::string_view s) const;
  const std::string& pattern() const { return pattern_; }

  /// `s` with every character that is special in a pattern escaped: a pattern that matches `s`
  /// literally.
  static std::string quote(std::string_view s);
  /// The reason `re` does not compile, or "" when it does.
  static std::string error_of(const std::string& re);

 private:
  std::shared_ptr<const re2::RE2> re_;
  std::string pattern_;
};

}  // namespace lopper
