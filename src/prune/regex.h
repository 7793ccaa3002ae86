// Regexes from the command line and recipes (internal).
#pragma once

#include <regex>
#include <string>

namespace lopper {

/// `re` compiled (ECMAScript); throws lopper::Error "[prune] WHAT 'RE' is not a valid regex: ...".
std::regex compile_regex(const std::string& re, const std::string& what);

}  // namespace lopper
