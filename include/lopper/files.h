// Files: the outputs of a command written as one unit (temporaries beside each, fsynced, renamed
// only when the whole command succeeded), and reads that refuse what is not a regular file.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <system_error>
#include <vector>

namespace lopper {

/// Reads a whole file; throws lopper::Error naming the path when it cannot, or when it is not a
/// regular file (a FIFO or a device is refused before it could block).
std::string read_file(const std::string& path);

/// Opens `path` for reading (O_RDONLY, never blocking on a FIFO) and returns the descriptor;
/// throws lopper::Error starting with `where` when it is missing, a folder, or not a regular file.
int open_regular_file(const std::string& path, const std::string& where);

/// Throws lopper::Error when `path` exists and is not a regular file (nothing is opened).
void check_regular_file(const std::string& path, const std::string& where);

/// Writes `bytes` to `path` through a temporary file in the same folder, fsync and a rename.
/// Refuses (lopper::Error) an existing `path` that is not a regular file.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// A temporary path beside `path` (same folder, unique hidden name).
std::string temp_path_beside(const std::string& path);

/// Removes `path` and, when it is a folder, everything in it; symbolic links are removed, never
/// followed. A missing `path` is no error. Sets `ec` on the first failure (it goes on with the
/// rest). std::filesystem::remove_all is not used: torch 2.11's libtorch.so exports its own copy,
/// which wins over libstdc++'s at load and crashes on any folder with contents.
void remove_tree(const std::string& path, std::error_code& ec);

/// The outputs of one command, written as one unit. Every output is declared before the work
/// (declare() refuses, with a UsageError, a path that exists and is not a regular file, names an
/// input or another output, or lies in no folder); its bytes go to a temporary file beside it;
/// commit() fsyncs every temporary, renames them all into place and fsyncs their folders.
/// Destroyed without commit() — the command failed — it removes its temporaries and the folders it
/// made, so a failure leaves nothing behind. Where the filesystem allows, a temporary has no name
/// until commit() (O_TMPFILE), so that even SIGKILL leaves nothing; elsewhere it is a hidden file
/// beside the output (".NAME.tmpXXXXXXXX"), removed on every signal that can be caught.
class OutputFiles {
 public:
  /// `cmd` names the command in errors: "[prune] -o out.onnx is a FIFO ...".
  explicit OutputFiles(std::string cmd);
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  /// A file the command reads: no output may be it (compared by device and inode, so another
  /// name of the same file is caught too). Missing paths are ignored.
  void input(const std::string& path);
  /// Declares `path` (given by `flag`, e.g. "-o") as an output, checking it now.
  void declare(const std::string& path, const std::string& flag);
  /// Whether `path` was declared already.
  bool declared(const std::string& path) const { return find(path) != nullptr; }
  /// A folder for outputs (run's --out): must be a folder if it exists; made now otherwise, and
  /// removed again if the command fails.
  void folder(const std::string& path, const std::string& flag);
  /// The temporary file to write `path`'s bytes to (declares `path` first if it was not).
  std::string temp(const std::string& path);
  /// Writes `bytes` as `path`'s temporary.
  void write(const std::string& path, const std::string& bytes);
  /// The bytes staged so far for `path` (its temporary's size), 0 when none.
  int64_t staged_bytes(const std::string& path) const;
  /// fsync, then rename every temporary into place. Throws lopper::Error when a step fails.
  void commit();

 private:
  struct Out {
    std::string path, flag, tmp;
    int fd = -1;  // an unnamed temporary (O_TMPFILE), tmp its /proc/self/fd path; -1: tmp is named
  };
  const Out* find(const std::string& path) const;
  Out* find(const std::string& path);
  std::string cmd_;
  std::deque<Out> outs_;  // a deque: the signal handler holds pointers into its strings
  std::vector<std::pair<uint64_t, uint64_t>> inputs_;  // (device, inode)
  std::vector<std::string> input_names_;
  std::vector<std::string> made_folders_;
  bool committed_ = false;
};

}  // namespace lopper
