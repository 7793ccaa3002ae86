// Progress of long work (calibration, training, sweeps) on stderr: a bar redrawn in place on a
// terminal, plain lines otherwise (CI logs, pipes), so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lopper {

class Progress {
 public:
  /// `label` starts every line ("calibrate", "epoch 3/10"); `total` steps (0: unknown).
  /// `lines` plain lines at most over the whole run when stderr is not a terminal (the last step
  /// always prints one).
  Progress(std::string label, int64_t total, int lines = 4, std::FILE* out = stderr);
  ~Progress();
  /// Step `done` (1-based) finished; `info` is appended ("loss 0.31  acc 91.2%").
  void update(int64_t done, const std::string& info = "");
  /// Ends the bar's line on a terminal (called by the destructor too).
  void finish();
  double elapsed_s() const;
  /// Whether `out` is a terminal.
  bool interactive() const { return tty_; }

 private:
  std::string label_;
  int64_t total_;
  int lines_;
  std::FILE* out_;
  bool tty_;
  bool open_ = false;  // a bar line is on screen without its newline
  int printed_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace lopper
