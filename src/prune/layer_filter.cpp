// LayerFilter: the one implementation of --exclude.
#include "prune/layer_filter.h"

#include "lopper/error.h"

namespace lopper {

std::regex compile_regex(const std::string& re, const std::string& what) {
  try {
    return std::regex(re);
  } catch (const std::regex_error& e) {
    throw Error("[prune] \x1e" + what + "\x1f '" + re + "' is not a valid regex: " + e.what());
  }
}

LayerFilter::LayerFilter(const std::string& exclude) : pattern_(exclude) {
  if (!exclude.empty()) re_ = compile_regex(exclude, "exclude");
}

bool LayerFilter::excludes(const std::vector<std::string>& names) {
  if (!re_) return false;
  for (const auto& n : names)
    if (!n.empty() && std::regex_search(n, *re_)) return matched_ = true;
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
