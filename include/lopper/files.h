// Files: atomic writes (temp file in the same folder, then rename) and whole-file reads.
#pragma once

#include <string>

namespace lopper {

/// Reads a whole file; throws lopper::Error naming the path when it cannot.
std::string read_file(const std::string& path);

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// A temporary path beside `path` (same folder, unique name). The caller renames or removes it.
std::string temp_path_beside(const std::string& path);

/// Renames `from` onto `to`, throwing lopper::Error (and removing `from`) on failure.
void commit_temp(const std::string& from, const std::string& to);

}  // namespace lopper
