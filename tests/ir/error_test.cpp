// The two kinds of failure: a user's mistake is a lopper::Error (exit 1, or 2 for usage); a failed
// LOPPER_ASSERT is lopper's bug, an InternalError that no user-error handler can take for one.
#include "lopper/error.h"

#include <gtest/gtest.h>

namespace lopper {
namespace {

TEST(Errors, AFailedAssertIsAnInternalErrorNotAUserError) {
  bool internal = false, user = false;
  try {
    LOPPER_ASSERT(1 + 1 == 3, "arithmetic ", 42);
  } catch (const Error&) {
    user = true;
  } catch (const InternalError& e) {
    internal = true;
    const std::string what = e.what();
    EXPECT_NE(what.find("a lopper bug"), std::string::npos) << what;
    EXPECT_NE(what.find("1 + 1 == 3"), std::string::npos) << what;
    EXPECT_NE(what.find("arithmetic 42"), std::string::npos) << what;
  }
  EXPECT_TRUE(internal);
  EXPECT_FALSE(user);
  EXPECT_THROW(LOPPER_CHECK(false, "[test] the user's mistake"), Error);
  EXPECT_NO_THROW(LOPPER_ASSERT(true));
}

// The library names its options as its structs spell them; only the CLI renders them as flags.
TEST(Errors, OptionsAreNamedByTheLibraryAndRenderedByTheCli) {
  try {
    LOPPER_CHECK(false, "[prune] " LOPPER_OPTION("round_to") " must be >= 1, got ", 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[prune] round_to must be >= 1, got 0");
    auto flag = [](const std::string& o) { return "--" + o + "!"; };
    EXPECT_EQ(e.render(+flag), "[prune] --round_to! must be >= 1, got 0");
  }
  // A copy rethrown as a UsageError keeps the marks; text without marks renders as it is.
  EXPECT_EQ(UsageError("[a] x " LOPPER_OPTION("y.z")).render([](const std::string& o) {
    return "<" + o + ">";
  }),
            "[a] x <y.z>");
  EXPECT_EQ(render_options("no { marks } here {x}"), "no { marks } here {x}");
  EXPECT_EQ(render_options("an unclosed \x1emark"), "an unclosed \x1emark");
}

}  // namespace
}  // namespace lopper
