// Progress: plain lines off a terminal (CI logs, pipes), a bar redrawn in place on one.
#include "lopper/progress.h"

#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <cstdio>
#include <string>

using lopper::Progress;

namespace {

// Everything written to `f` (a pipe's write end) after it is closed.
std::string drain(int fd) {
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) s.append(buf, size_t(n));
  return s;
}

}  // namespace

TEST(Progress, PlainLinesOffATerminal) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::FILE* w = ::fdopen(p[1], "w");
  {
    Progress bar("calibrate", 8, 4, w);
    EXPECT_FALSE(bar.interactive());
    for (int i = 1; i <= 8; ++i) bar.update(i, "loss 1.0");
  }
  std::fclose(w);
  std::string out = drain(p[0]);
  ::close(p[0]);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find("\033["), std::string::npos) << out;
  int lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 4) << out;  // at 2, 4, 6 and 8 of 8
  EXPECT_NE(out.find("calibrate 2/8  loss 1.0"), std::string::npos) << out;
  EXPECT_NE(out.find("calibrate 8/8  loss 1.0"), std::string::npos) << out;
}

// Step 0 with a text is the plan of the work: always a line of its own, before any step.
TEST(Progress, StepZeroSaysThePlan) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::FILE* w = ::fdopen(p[1], "w");
  {
    Progress bar("sensitivity", 100, 2, w);
    bar.update(0, "3 layers x 2 amounts");
    for (int i = 1; i <= 100; ++i) bar.update(i, "batch");
  }
  std::fclose(w);
  const std::string out = drain(p[0]);
  ::close(p[0]);
  EXPECT_EQ(out.rfind("sensitivity 0/100  3 layers x 2 amounts", 0), 0u) << out;
  int lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 3) << out;  // the plan, 50 and 100 of 100
}

TEST(Progress, ABarRedrawnOnATerminal) {
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  std::FILE* w = ::fdopen(slave, "w");
  {
    Progress bar("epoch 1/2", 3, 1, w);
    EXPECT_TRUE(bar.interactive());
    for (int i = 1; i <= 3; ++i) bar.update(i, "loss 0.5");
  }
  std::fclose(w);
  // Every redraw reached the terminal by now, but one read() may return only the first of them:
  // read until the closed slave side reads as the end (EIO).
  const std::string out = drain(master);
  ::close(master);
  ASSERT_FALSE(out.empty());
  EXPECT_NE(out.find('\r'), std::string::npos) << out;
  EXPECT_NE(out.find("[########################] 3/3"), std::string::npos) << out;
  EXPECT_NE(out.find("ETA"), std::string::npos) << out;  // while it was running
}
