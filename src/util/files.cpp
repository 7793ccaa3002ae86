#include "lopper/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <utility>

#include "lopper/error.h"

namespace lopper {

namespace {

namespace fs = std::filesystem;

// What a non-regular file is, for messages.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a folder (a directory)";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

// NOTE: the temporaries alive now, for the handler of every signal that ends the process by
// default: it may only call async-signal-safe functions (unlink), so the paths sit in fixed slots
// it reads with atomics. SIGKILL cannot be caught: what it can leave is named in the README.
constexpr size_t kSlots = 64;
std::array<std::atomic<const char*>, kSlots> g_live{};
std::once_flag g_handlers;

void on_signal(int sig) {
  for (auto& s : g_live)
    if (const char* p = s.load()) ::unlink(p);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void track(const std::string& tmp) {
  std::call_once(g_handlers, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGXCPU,
                    SIGVTALRM, SIGPROF, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGSYS}) {
      struct sigaction old {};
      ::sigaction(sig, nullptr, &old);
      if (old.sa_handler == SIG_DFL) std::signal(sig, on_signal);  // leave others' handlers be
    }
  });
  for (auto& s : g_live) {
    const char* expected = nullptr;
    if (s.compare_exchange_strong(expected, tmp.c_str())) return;
  }
}

void untrack(const std::string& tmp) {
  for (auto& s : g_live) {
    const char* expected = tmp.c_str();
    s.compare_exchange_strong(expected, nullptr);
  }
}

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// What temp_path_beside() adds to a file's name: "." before it, ".tmp" and 8 hex digits after.
constexpr size_t kTempNameExtra = 13;

std::string folder_of(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Writes all of `bytes` to the open file `fd`; false on failure (errno set).
bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// An unnamed file in `dir` (O_TMPFILE) that can be linked into it later through
// /proc/self/fd, or -1 where the filesystem or the kernel cannot make one.
int unnamed_file_in(const std::string& dir) {
#ifdef O_TMPFILE
  static const bool proc = ::access("/proc/self/fd", X_OK) == 0;
  if (!proc) return -1;
  return ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
#else
  return -1;
#endif
}

// Writes all of `bytes` to a new file `tmp` and fsyncs it; false on failure (errno set).
bool write_synced(const std::string& tmp, const std::string& bytes) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      errno = e;
      return false;
    }
    done += size_t(n);
  }
  bool ok = ::fsync(fd) == 0;
  int e = errno;
  ::close(fd);
  errno = e;
  return ok;
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& where) {
  // NOTE: O_NONBLOCK so that opening a FIFO returns at once instead of waiting for a writer; the
  // fstat below then refuses it. Regular files ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  LOPPER_CHECK(fd >= 0, where, " cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd);
    throw Error(detail::concat(where, " '", path, "' is ", file_kind(m), ", not a regular file"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void check_regular_file(const std::string& path, const std::string& where) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(
        detail::concat(where, " '", path, "' is ", file_kind(st.st_mode), ", not a regular file"));
}

std::string read_file(const std::string& path) {
  int fd = open_regular_file(path, "[io]");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    LOPPER_CHECK(n >= 0, "[io] cannot read '", path, "': ", std::strerror(errno));
    if (n == 0) break;
    bytes.append(buf, size_t(n));
  }
  return bytes;
}

std::string temp_path_beside(const std::string& path) {
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".tmp%08x", static_cast<unsigned>(rd()));
  fs::path p(path);
  return (p.parent_path() / ("." + p.filename().string() + suffix)).string();
}

void remove_tree(const std::string& path, std::error_code& ec) {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return;
  }
  // nftw: depth first (a folder after its contents), physical (links are entries, not followed).
  static thread_local int first_error;
  first_error = 0;
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) {
    if (::remove(p) != 0 && first_error == 0) first_error = errno;
    return 0;
  };
  if (::nftw(path.c_str(), remove_one, 32, FTW_DEPTH | FTW_PHYS) != 0 && first_error == 0)
    first_error = errno;
  if (first_error != 0) ec.assign(first_error, std::generic_category());
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  OutputFiles out("io");
  out.write(path, bytes);
  out.commit();
}

OutputFiles::OutputFiles(std::string cmd) : cmd_(std::move(cmd)) {}

OutputFiles::~OutputFiles() {
  for (const auto& o : outs_)
    if (o.fd >= 0) ::close(o.fd);  // an unnamed temporary goes with its last descriptor
  if (committed_) return;
  for (const auto& o : outs_)
    if (!o.tmp.empty() && o.fd < 0) {
      ::unlink(o.tmp.c_str());
      untrack(o.tmp);
    }
  std::error_code ec;
  for (auto it = made_folders_.rbegin(); it != made_folders_.rend(); ++it)
    fs::remove(*it, ec);  // only when empty: nothing of anyone else's goes
}

void OutputFiles::input(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return;
  for (const auto& o : outs_) {
    struct stat so {};
    if (::stat(o.path.c_str(), &so) == 0 && so.st_dev == st.st_dev && so.st_ino == st.st_ino)
      throw UsageError("[" + cmd_ + "] " + o.flag + " " + o.path + " names an input (" + path +
                       "); lopper never overwrites what it reads");
  }
  inputs_.emplace_back(uint64_t(st.st_dev), uint64_t(st.st_ino));
  input_names_.push_back(path);
}

OutputFiles::Out* OutputFiles::find(const std::string& path) {
  return const_cast<Out*>(std::as_const(*this).find(path));
}

const OutputFiles::Out* OutputFiles::find(const std::string& path) const {
  const fs::path want = fs::path(path).lexically_normal();
  for (const auto& o : outs_)
    if (fs::path(o.path).lexically_normal() == want) return &o;
  return nullptr;
}

void OutputFiles::declare(const std::string& path, const std::string& flag) {
  const std::string who = "[" + cmd_ + "] " + flag + " " + path;
  if (path.empty()) throw UsageError("[" + cmd_ + "] " + flag + " is empty");
  if (const Out* o = find(path)) {
    if (o->flag == flag) return;
    throw UsageError(who + ": another output (" + o->flag + ") names the same file");
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      throw UsageError(who + " is " + file_kind(st.st_mode) +
                       ", not a regular file; lopper writes outputs to new or regular files only");
    for (size_t i = 0; i < inputs_.size(); ++i)
      if (inputs_[i] == std::make_pair(uint64_t(st.st_dev), uint64_t(st.st_ino)))
        throw UsageError(who + " names an input (" + input_names_[i] +
                         "); lopper never overwrites what it reads");
    for (const auto& o : outs_) {
      struct stat so {};
      if (::stat(o.path.c_str(), &so) == 0 && so.st_dev == st.st_dev && so.st_ino == st.st_ino)
        throw UsageError(who + ": another output (" + o.flag + " " + o.path + ") is the same file");
    }
  } else if (errno != ENOENT) {
    throw UsageError(who + ": " + std::strerror(errno));
  }
  const std::string dir = folder_of(path);
  struct stat sd {};
  if (::stat(dir.c_str(), &sd) != 0 || !S_ISDIR(sd.st_mode))
    throw UsageError(who + ": no folder " + dir);
  // NOTE: the temporary beside it is named ".NAME.tmpXXXXXXXX" (temp_path_beside): a name that
  // fits but leaves no room for that would fail only after the work.
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t most = size_t(name_max > 0 ? name_max : 255) - kTempNameExtra;
  const size_t length = fs::path(path).filename().string().size();
  if (length > most)
    throw UsageError(detail::concat(who, ": the file name is too long (", length,
                                    " bytes; at most ", most,
                                    " here, with the temporary lopper "
                                    "writes beside it)"));
  outs_.push_back({path, flag, ""});
}

void OutputFiles::folder(const std::string& path, const std::string& flag) {
  const std::string who = "[" + cmd_ + "] " + flag + " " + path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0)
      throw UsageError(who + " is a broken symbolic link");
    if (!S_ISDIR(st.st_mode))
      throw UsageError(who + " is " + file_kind(st.st_mode) + ", not a folder");
    return;
  }
  const std::string parent = folder_of(path);
  struct stat sp {};
  if (::stat(parent.c_str(), &sp) != 0 || !S_ISDIR(sp.st_mode))
    throw UsageError(who + ": no folder " + parent);
  if (::mkdir(path.c_str(), 0755) != 0)
    throw Error(who + ": cannot make the folder: " + std::strerror(errno));
  made_folders_.push_back(path);
}

std::string OutputFiles::temp(const std::string& path) {
  if (!find(path)) declare(path, "output");
  Out& o = *find(path);
  if (o.tmp.empty()) {
    o.fd = unnamed_file_in(folder_of(o.path));
    if (o.fd >= 0) {
      o.tmp = "/proc/self/fd/" + std::to_string(o.fd);
    } else {
      o.tmp = temp_path_beside(o.path);
      track(o.tmp);
    }
  } else if (o.fd >= 0) {
    LOPPER_CHECK(::ftruncate(o.fd, 0) == 0, "[", cmd_, "] cannot write '", o.path,
                 "': ", std::strerror(errno));  // written again: start from nothing
  } else {
    ::unlink(o.tmp.c_str());  // written again: start from nothing
  }
  return o.tmp;
}

void OutputFiles::write(const std::string& path, const std::string& bytes) {
  const std::string tmp = temp(path);
  if (const Out* o = find(path); o->fd >= 0) {
    if (::lseek(o->fd, 0, SEEK_SET) != 0 || !write_all(o->fd, bytes) || ::fsync(o->fd) != 0)
      throw Error(detail::concat("[", cmd_, "] cannot write '", path, "': ", std::strerror(errno)));
    return;
  }
  if (!write_synced(tmp, bytes)) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(detail::concat("[", cmd_, "] cannot write '", path, "': ", std::strerror(e)));
  }
}

int64_t OutputFiles::staged_bytes(const std::string& path) const {
  const Out* o = find(path);
  struct stat st {};
  if (!o || o->tmp.empty() || ::stat(o->tmp.c_str(), &st) != 0) return 0;
  return int64_t(st.st_size);
}

void OutputFiles::commit() {
  LOPPER_ASSERT(!committed_, "outputs committed twice");
  for (const auto& o : outs_) {
    if (o.tmp.empty()) continue;
    struct stat st {};
    LOPPER_CHECK(::stat(o.tmp.c_str(), &st) == 0, "[", cmd_, "] cannot write '", o.path,
                 "': its temporary file is gone");
    fsync_path(o.tmp, O_RDONLY);
  }
  // NOTE: the output may have turned into something else since declare() (a FIFO made while a
  // long job ran): checked again just before the rename that would replace it.
  for (const auto& o : outs_) {
    if (o.tmp.empty()) continue;
    struct stat st {};
    if (::lstat(o.path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw UsageError("[" + cmd_ + "] " + o.flag + " " + o.path + " is now " +
                       file_kind(st.st_mode) + ", not a regular file; nothing written");
  }
  std::vector<std::string> dirs;
  for (auto& o : outs_) {
    if (o.tmp.empty()) continue;
    if (o.fd >= 0) {
      // NOTE: an unnamed temporary gets a hidden name only now, for the rename that replaces the
      // output at once (linkat cannot replace a file); a signal between the two is handled as for
      // any named temporary.
      const std::string unnamed = o.tmp;
      o.tmp = temp_path_beside(o.path);
      track(o.tmp);  // the handler reads the string where it stays: in the deque
      const int fd = o.fd;
      o.fd = -1;
      const bool linked =
          ::linkat(AT_FDCWD, unnamed.c_str(), AT_FDCWD, o.tmp.c_str(), AT_SYMLINK_FOLLOW) == 0;
      const int e = errno;
      ::close(fd);
      if (!linked) {
        untrack(o.tmp);
        o.tmp.clear();
        throw Error(detail::concat("[", cmd_, "] cannot write '", o.path, "': ", std::strerror(e)));
      }
    }
    if (std::rename(o.tmp.c_str(), o.path.c_str()) != 0) {
      const int e = errno;
      ::unlink(o.tmp.c_str());
      untrack(o.tmp);
      throw Error(detail::concat("[", cmd_, "] cannot write '", o.path, "': ", std::strerror(e)));
    }
    untrack(o.tmp);
    dirs.push_back(folder_of(o.path));
  }
  committed_ = true;
  for (const auto& d : dirs) fsync_path(d, O_RDONLY | O_DIRECTORY);
}

}  // namespace lopper
