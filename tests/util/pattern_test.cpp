// The patterns users write (--exclude, recipe match, --freeze) against names from hostile models:
// the ECMAScript syntax users write, in time linear in the name and with a stack that does not
// grow with it; one line for a pattern that does not compile.
#include "util/pattern.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "lopper/error.h"
#include "lopper/prune.h"
#include "prune/layer_filter.h"

using lopper::Pattern;

TEST(Pattern, TheSyntaxUsersWrite) {
  EXPECT_TRUE(Pattern(".*embed.*", "exclude").search("model.embed_tokens"));
  EXPECT_TRUE(Pattern("^layers\\.(0|1)\\.", "exclude").search("layers.1.mlp"));
  EXPECT_FALSE(Pattern("^layers\\.(0|1)\\.", "exclude").search("layers.10.mlp"));
  EXPECT_TRUE(Pattern("(?:q|k|v)_proj$", "match").search("self_attn.k_proj"));
  EXPECT_TRUE(Pattern("\\d+\\.fc\\b", "match").search("blocks.12.fc.weight"));
  EXPECT_TRUE(Pattern("[A-Z][a-z]{2,3}_\\w+", "match").search("/m/Conv_12"));
  EXPECT_TRUE(Pattern("lm_head", "exclude").search("lm_head"));
  EXPECT_FALSE(Pattern("^lm_head$", "exclude").search("model.lm_head"));
  // The escapes ECMAScript allows on any punctuation.
  EXPECT_TRUE(Pattern("\\/m\\/fc\\-1", "exclude").search("/m/fc-1"));
  EXPECT_TRUE(Pattern("epoch-\\d+", "resume").full_match("epoch-12"));
  EXPECT_FALSE(Pattern("epoch-\\d+", "resume").full_match("epoch-12x"));
  // A name's bytes, whatever they are: invalid UTF-8 still matches '.'.
  EXPECT_TRUE(Pattern("^a.b$", "exclude")
                  .search(std::string("a\xff"
                                      "b")));
  EXPECT_EQ(Pattern("%(p_[a-z_]*weight)\\b", "fx").find_all("%p_fc_weight, %p_b_weight x"),
            (std::vector<std::string>{"p_fc_weight", "p_b_weight"}));
  const std::string odd = "a.b*c(d)[e]{f}|g^h$i?j+k\\l/m";
  EXPECT_TRUE(Pattern("^" + Pattern::quote(odd) + "$", "match").search(odd));
  EXPECT_FALSE(Pattern("^" + Pattern::quote(odd) + "$", "match").search("aXb*c(d)[e]{f}|g^h$i"));
}

TEST(Pattern, HostileNamesEndAtOnce) {
  // std::regex recursed per character here (a segfault) and backtracked without end on the
  // second; both must finish in a fraction of a second.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string huge(200000, 'x');
  EXPECT_FALSE(Pattern(".*embed.*", "exclude").search(huge));
  EXPECT_TRUE(Pattern(".*embed.*", "exclude").search(huge + "embed" + huge));
  EXPECT_FALSE(Pattern("(a+)+z", "exclude").search(std::string(1000, 'a')));
  EXPECT_FALSE(Pattern("(a|aa)*b", "exclude").search(std::string(100000, 'a')));
  lopper::LayerFilter f(".*embed.*");
  EXPECT_TRUE(f.excludes(huge + "embed", ""));
  EXPECT_TRUE(Pattern("[0-9]+", "amount").full_match(std::string(300000, '7')));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);
}

TEST(Pattern, OneLineForAPatternThatDoesNotCompile) {
  for (const char* bad : {"(", "a{2,1}", "[z-a]", "(?<=x)y", "(a)\\1", "*"}) {
    try {
      Pattern p(bad, "exclude");
      ADD_FAILURE() << bad << " compiled";
    } catch (const lopper::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_NE(m.find("is not a valid regex"), std::string::npos) << m;
      EXPECT_NE(m.find(bad), std::string::npos) << m;
    }
    EXPECT_FALSE(lopper::regex_error(bad).empty()) << bad;
  }
  EXPECT_TRUE(lopper::regex_error(".*embed.*").empty());
}
