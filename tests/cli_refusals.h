// Command lines the CLI tests expect refused, and the checks each refusal gets.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace lopper::test {

/// A command line expected refused: its arguments, its exit code and a piece of its message.
struct BadCase {
  std::string args;
  int code;
  std::string needle;
};

/// Runs `lopper COMMAND ARGS` for each case: its exit code, one line of error that holds the
/// needle, and none of the files `unwritten` written.
inline void expect_refused(const std::string& command, const std::vector<BadCase>& cases,
                           const std::vector<std::string>& unwritten) {
  for (const auto& c : cases) {
    auto r = lopper_cli(command + " " + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    for (const auto& f : unwritten) EXPECT_FALSE(std::filesystem::exists(f)) << c.args;
  }
}

}  // namespace lopper::test
