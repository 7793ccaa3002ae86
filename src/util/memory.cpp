#include "lopper/memory.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace lopper {

int64_t memory_bytes() {
  static const int64_t bytes = [] {
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    int64_t n = pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
    // A container's limit (cgroup v2) is the memory this process can really have.
    std::ifstream f("/sys/fs/cgroup/memory.max");
    int64_t limit = 0;
    if (f >> limit && limit > 0 && (n == 0 || limit < n)) n = limit;
    return n;
  }();
  return bytes;
}

int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    // Linux lists CPU 0's caches as index0, index1, ...; the highest level that holds data wins.
    int best_level = 0;
    int64_t size = 0;
    for (int i = 0; i < 16; ++i) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
      std::ifstream level_f(dir + "/level"), type_f(dir + "/type"), size_f(dir + "/size");
      int level = 0;
      std::string type, text;
      if (!(level_f >> level) || !(type_f >> type) || !(size_f >> text)) break;
      if (type == "Instruction" || level < best_level || text.empty()) continue;
      int64_t n = std::atoll(text.c_str());
      const char unit = text.back();
      n *= unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : unit == 'G' ? 1024 * 1024 * 1024 : 1;
      if (n > 0) {
        best_level = level;
        size = n;
      }
    }
    return size;
  }();
  return bytes;
}

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (bytes >= 1000 && u < 6) {
    bytes /= 1000;
    ++u;
  }
  char buf[64];
  if (u == 0 || bytes >= 10)
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

double tensor_bytes(const std::vector<int64_t>& shape, size_t elem_size) {
  double n = static_cast<double>(elem_size);
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    n *= static_cast<double>(d);
  }
  return n;
}

std::string dims_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s + "]";
}

bool exceeds_memory(double bytes) {
  int64_t have = memory_bytes();
  return have > 0 && bytes > static_cast<double>(have);
}

std::string memory_message(const std::string& what, double bytes) {
  return what + " needs " + human_bytes(bytes) + ", more than this machine's memory (" +
         human_bytes(static_cast<double>(memory_bytes())) + ")";
}

std::string allocation_size_in(const std::string& message) {
  for (const char* key : {"allocate ", "Allocate "}) {
    size_t at = message.find(key);
    if (at == std::string::npos) continue;
    at += std::string(key).size();
    size_t end = message.find_first_of(" ", at);
    if (end == std::string::npos) continue;
    std::string number = message.substr(at, end - at);
    size_t unit_end = message.find_first_of(" .;,()\n", end + 1);
    std::string unit = message.substr(
        end + 1, unit_end == std::string::npos ? std::string::npos : unit_end - end - 1);
    char* stop = nullptr;
    double v = std::strtod(number.c_str(), &stop);
    if (number.empty() || *stop != '\0' || !std::isfinite(v)) continue;
    if (unit == "bytes" || unit == "B") return human_bytes(v);
    return number + " " + unit;
  }
  return "";
}

std::string first_line(const std::string& message) {
  size_t i = 0;
  while (i < message.size()) {
    size_t j = message.find_first_of("\r\n", i);
    if (j == std::string::npos) j = message.size();
    size_t b = message.find_first_not_of(" \t", i);
    if (b != std::string::npos && b < j) {
      size_t e = message.find_last_not_of(" \t", j - 1);
      return message.substr(b, e - b + 1);
    }
    i = j + 1;
  }
  return "";
}

}  // namespace lopper
