// How much memory a tensor needs and whether this machine has it: the checks that turn a memory
// bomb (a ConstantOfShape of 10^12 elements, --shape 100000x100000x100000) into one line naming the
// thing, before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

namespace lopper {

/// What lopper's CPU allocator throws when the system refuses a block: a std::bad_alloc that
/// knows the size asked for.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(size_t bytes) : bytes_(bytes) {}
  size_t bytes() const { return bytes_; }
  const char* what() const noexcept override { return "out of memory"; }

 private:
  size_t bytes_;
};

/// This machine's memory in bytes: physical memory, or the cgroup's limit when lower; 0 if unknown.
int64_t memory_bytes();
/// The size of CPU 0's last-level cache in bytes (Linux's sysfs); 0 if unknown.
int64_t last_level_cache_bytes();
/// Bytes in decimal units, two significant digits: "512 B", "4.0 TB", "24 GB".
std::string human_bytes(double bytes);
/// Bytes a tensor of `shape` with `elem_size`-byte elements needs, as a double (a product of
/// absurd dims never overflows); 0 when a dim is 0 or negative.
double tensor_bytes(const std::vector<int64_t>& shape, size_t elem_size);
/// "[1000000x1000000]".
std::string dims_string(const std::vector<int64_t>& shape);
/// True when `bytes` exceed this machine's memory (never when that is unknown).
bool exceeds_memory(double bytes);
/// "<what> needs 4.0 TB, more than this machine's memory (24 GB)".
std::string memory_message(const std::string& what, double bytes);
/// The size named in an out-of-memory message from c10 ("... tried to allocate 4000000000000
/// bytes", "Tried to allocate 20.00 GiB"), human-readable; "" when it names none.
std::string allocation_size_in(const std::string& message);
/// The first non-empty line of `message`, trimmed (messages from ATen and oneDNN may run to
/// several lines; lopper prints one).
std::string first_line(const std::string& message);

}  // namespace lopper
