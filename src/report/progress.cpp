// Progress: a redrawn bar on a terminal, a few plain lines elsewhere.
#include "lopper/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace lopper {

namespace {

std::string duration(double s) {
  if (s < 0 || s > 1e7) return "?";
  int64_t t = int64_t(s + 0.5);
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
}

}  // namespace

Progress::Progress(std::string label, int64_t total, int lines, std::FILE* out)
    : label_(std::move(label)),
      total_(total),
      lines_(std::max(1, lines)),
      out_(out),
      tty_(::isatty(::fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, const std::string& info) {
  double el = elapsed_s();
  std::string eta = total_ > 0 && done > 0 && done < total_
                        ? "  ETA " + duration(el / double(done) * double(total_ - done))
                        : "";
  std::string count = total_ > 0 ? fmt::format("{}/{}", done, total_) : fmt::format("{}", done);
  std::string tail = (info.empty() ? "" : "  " + info) + "  " + duration(el) + eta;
  if (tty_) {
    auto now = std::chrono::steady_clock::now();
    // Redraw at most 10 times a second, and always the last step.
    if (open_ && done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::string bar;
    if (total_ > 0) {
      int width = 24, fill = int(double(width) * double(std::min(done, total_)) / double(total_));
      bar = " [" + std::string(fill, '#') + std::string(width - fill, '.') + "]";
    }
    std::fprintf(out_, "\r\033[K%s%s %s%s", label_.c_str(), bar.c_str(), count.c_str(),
                 tail.c_str());
    std::fflush(out_);
    open_ = true;
    if (total_ > 0 && done >= total_) finish();
    return;
  }
  // Plain lines: at evenly spaced steps and at the last one, and step 0 when it says something
  // (the plan of the work).
  bool last = total_ > 0 && done >= total_;
  bool due = total_ > 0 ? done * lines_ >= int64_t(printed_ + 1) * total_ : true;
  if (done == 0 && !info.empty()) due = true;
  if (!last && !due) return;
  while (total_ > 0 && done * lines_ >= int64_t(printed_ + 1) * total_) ++printed_;
  std::fprintf(out_, "%s %s%s\n", label_.c_str(), count.c_str(), tail.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (tty_ && open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  open_ = false;
}

}  // namespace lopper
