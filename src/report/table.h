// Helpers for the text tables lopper prints (internal).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lopper {

/// A name column's width: the longest of `names`, at least `min`, at most 48.
size_t name_column_width(const std::vector<std::string>& names, size_t min);
/// `name` cut to `width` from the left ("…" + its end) when longer.
std::string fit_name(const std::string& name, size_t width);

}  // namespace lopper
