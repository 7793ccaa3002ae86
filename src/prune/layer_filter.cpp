// LayerFilter: the one implementation of --exclude.
#include "prune/layer_filter.h"

#include "lopper/error.h"
#include "lopper/prune.h"

namespace lopper {

std::string regex_error(const std::string& re) { return Pattern::error_of(re); }

LayerFilter::LayerFilter(const std::string& exclude) : pattern_(exclude) {
  if (!exclude.empty()) re_ = compile_regex(exclude, "exclude");
}

bool LayerFilter::excludes(const std::vector<std::string>& names) {
  if (!re_) return false;
  for (const auto& n : names)
    if (!n.empty() && re_->search(n)) return matched_ = true;
  return false;
}

std::string LayerFilter::unmatched_warning() const {
  // NOTE: a report's warning, not an error: it names the flag, as the report's skip reasons do.
  return re_ && !matched_ ? "--exclude '" + pattern_ + "' matched no layer" : "";
}

std::string LayerFilter::leaves_none() const {
  return re_ ? " (" LOPPER_OPTION("exclude") " leaves none)" : "";
}

}  // namespace lopper
