// LayerFilter: the one implementation of --exclude.
#include "prune/layer_filter.h"

#include "lopper/error.h"

namespace lopper {

std::regex compile_regex(const std::string& re, const std::string& what) {
  try {
    return std::regex(re);
  } catch (const std::regex_error& e) {
    throw Error("[prune] " + what + " '" + re + "' is not a valid regex: " + e.what());
  }
}

LayerFilter::LayerFilter(const std::string& exclude, const char* option)
    : pattern_(exclude), option_(option) {
  if (!exclude.empty()) re_ = compile_regex(exclude, option);
}

bool LayerFilter::excludes(const std::vector<std::string>& names) {
  if (!re_) return false;
  for (const auto& n : names)
    if (!n.empty() && std::regex_search(n, *re_)) return matched_ = true;
  return false;
}

std::string LayerFilter::unmatched_warning() const {
  return re_ && !matched_ ? option_ + " '" + pattern_ + "' matched no layer" : "";
}

std::string LayerFilter::leaves_none() const { return re_ ? " (" + option_ + " leaves none)" : ""; }

}  // namespace lopper
