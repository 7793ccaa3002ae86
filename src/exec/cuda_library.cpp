// Finds and loads liblopper_cuda.so (kernels/cuda/library.h) the first time lopper needs CUDA.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cuda/library.h"
#include "lopper/error.h"

namespace lopper::kernels::cuda {
namespace {

constexpr const char* kName = "liblopper_cuda.so";

struct Loaded {
  const Library* library = nullptr;
  std::string error;
};

// The folder of the executable or shared object this code was linked into.
std::filesystem::path own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_folder), &info) == 0 || info.dli_fname == nullptr)
    return {};
  std::error_code ec;
  auto p = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path() : p.parent_path();
}

Loaded load() {
  std::vector<std::string> tried;
  void* handle = nullptr;
  auto attempt = [&](const std::string& path, int extra) {
    if (handle != nullptr || path.empty()) return;
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | extra);
    if (handle == nullptr && extra == 0) {
      const char* why = dlerror();
      // A missing file is expected on the way; anything else (a dependency missing, a bad
      // file) is what the user needs to see.
      std::error_code ec;
      if (path.find('/') == std::string::npos || std::filesystem::exists(path, ec))
        tried.push_back(why != nullptr ? why : path);
    }
  };
  if (const char* env = std::getenv("LOPPER_CUDA_LIBRARY"); env != nullptr && *env != '\0') {
    attempt(env, 0);
    if (handle == nullptr)
      return {nullptr, detail::concat("LOPPER_CUDA_LIBRARY=", env, ": ",
                                      tried.empty() ? "no such file" : tried.back())};
  }
  attempt(kName, RTLD_NOLOAD);  // linked by the program (the tests, a program on lopper::lopper)
  if (const auto dir = own_folder(); !dir.empty()) {
    attempt((dir / kName).string(), 0);
    attempt((dir.parent_path() / "lib" / kName).string(), 0);  // installed: bin/ and lib/
  }
#ifdef LOPPER_CUDA_LIBRARY_BUILT
  attempt(LOPPER_CUDA_LIBRARY_BUILT, 0);  // where this build wrote it
#endif
  attempt(kName, 0);  // LD_LIBRARY_PATH, the program's RUNPATH
  if (handle == nullptr) {
    std::string why = tried.empty() ? std::string("not found") : tried.back();
    return {nullptr, detail::concat(kName, " could not be loaded (", why, ")")};
  }
  using Entry = const Library* (*)(int);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "lopper_cuda_library"));
  if (entry == nullptr) return {nullptr, detail::concat(kName, " has no lopper_cuda_library()")};
  const Library* lib = entry(kLibraryAbi);
  if (lib == nullptr)
    return {nullptr, detail::concat(kName, " is from another build of lopper (interface ",
                                    kLibraryAbi, " expected)")};
  return {lib, ""};
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe, once
  return l;
}

}  // namespace

const Library* library() { return loaded().library; }

std::string load_error() { return loaded().error; }

const Library& need_library() {
  const Library* lib = library();
  LOPPER_CHECK(lib != nullptr, "[cuda] lopper's CUDA library: ", load_error());
  return *lib;
}

}  // namespace lopper::kernels::cuda
