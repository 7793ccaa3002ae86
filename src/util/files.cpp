#include "lopper/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "lopper/error.h"

namespace lopper {

std::string read_file(const std::string& path) {
  struct stat st {};
  LOPPER_CHECK(::stat(path.c_str(), &st) == 0, "[io] cannot open '", path, "': ",
               std::strerror(errno));
  LOPPER_CHECK(!S_ISDIR(st.st_mode), "[io] '", path, "' is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  LOPPER_CHECK(f.good(), "[io] cannot open '", path, "': ", std::strerror(errno));
  std::string bytes;
  bytes.resize(static_cast<size_t>(st.st_size));
  f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  LOPPER_CHECK(static_cast<size_t>(f.gcount()) == bytes.size(), "[io] short read from '", path,
               "'");
  return bytes;
}

std::string temp_path_beside(const std::string& path) {
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".tmp%08x", static_cast<unsigned>(rd()));
  std::filesystem::path p(path);
  return (p.parent_path() / ("." + p.filename().string() + suffix)).string();
}

void commit_temp(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    int e = errno;
    std::remove(from.c_str());
    throw Error(detail::concat("[io] cannot write '", to, "': ", std::strerror(e)));
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = temp_path_beside(path);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    LOPPER_CHECK(f.good(), "[io] cannot write '", path, "': ", std::strerror(errno));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      throw Error(detail::concat("[io] cannot write '", path, "': write failed"));
    }
  }
  commit_temp(tmp, path);
}

}  // namespace lopper
