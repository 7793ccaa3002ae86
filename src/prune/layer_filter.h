// Which layers an option leaves out (--exclude, the trainer's schedules, sensitivity, targets),
// and the regexes of the command line and recipes (internal).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "util/pattern.h"

namespace lopper {

/// `re` compiled (util/pattern.h); throws lopper::Error "[prune] WHAT 'RE' is not a valid regex:
/// ..." naming the option `what`.
inline Pattern compile_regex(const std::string& re, const std::string& what) {
  return Pattern(re, what);
}

/// An `exclude` option: a regex (util/pattern.h) searched in each name of a layer (its nodes, its
/// weight, its PyTorch parameter: PrunableWeight::names), compiled once. Empty: it leaves nothing
/// out.
class LayerFilter {
 public:
  /// Throws lopper::Error (option "exclude") when `exclude` is not a valid regex.
  explicit LayerFilter(const std::string& exclude);
  bool empty() const { return !re_; }
  /// Whether the regex is found in any of `names` (empty names are skipped).
  bool excludes(const std::vector<std::string>& names);
  bool excludes(const std::string& node, const std::string& weight) {
    return excludes(std::vector<std::string>{node, weight});
  }
  /// Whether some layer was left out so far (an exclude that matches nothing is worth a warning).
  bool matched() const { return matched_; }
  /// "--exclude 'RE' matched no layer" when the filter left nothing out; "" otherwise.
  std::string unmatched_warning() const;
  /// " (exclude leaves none)", the option marked, when the filter is on; "" otherwise: for
  /// "nothing left" errors.
  std::string leaves_none() const;

 private:
  std::optional<Pattern> re_;
  std::string pattern_;
  bool matched_ = false;
};

}  // namespace lopper
