#include "libs/common/config.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, test_port, 1, "test flag");
ABSL_FLAG(std::string, test_name, "default", "test flag");
ABSL_FLAG(bool, test_enabled, false, "test flag");

namespace rlfleet::common {
namespace {

TEST(ConfigText, ParsesPairsCommentsAndBlankLines) {
  auto entries = ParseConfigText("# header\n\nport = 7000  # trailing\n--name=a b\n", "t.conf");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].key, "port");
  EXPECT_EQ((*entries)[0].value, "7000");
  EXPECT_EQ((*entries)[0].line, 3);
  EXPECT_EQ((*entries)[1].key, "name");
  EXPECT_EQ((*entries)[1].value, "a b");
}

// A `#` inside a token is part of it; only one at a line's start or after whitespace
// starts a comment.
TEST(ConfigText, AHashInsideAValueIsPartOfIt) {
  auto entries = ParseConfigText(
      "auth_token = ab#cd\nurl = redis://h:1/#frag   # the url\n\t# indented comment\n"
      "tabbed = x\t#comment\nlast = a#b#c#\n",
      "t.conf");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 4u);
  EXPECT_EQ((*entries)[0].key, "auth_token");
  EXPECT_EQ((*entries)[0].value, "ab#cd");
  EXPECT_EQ((*entries)[1].value, "redis://h:1/#frag");
  EXPECT_EQ((*entries)[2].key, "tabbed");
  EXPECT_EQ((*entries)[2].value, "x");
  EXPECT_EQ((*entries)[3].key, "last");
  EXPECT_EQ((*entries)[3].value, "a#b#c#");
}

TEST(ConfigText, AValueMadeOfAHashAfterEqualsIsKept) {
  auto entries = ParseConfigText("hash=#x\nspaced = #y\n", "t.conf");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].value, "#x");
  EXPECT_EQ((*entries)[1].value, "");  // `#` after whitespace: a comment, an empty value
}

TEST(ConfigText, RejectsMalformedLinesWithTheirLineNumber) {
  auto no_eq = ParseConfigText("port = 1\njust words\n", "t.conf");
  ASSERT_FALSE(no_eq.ok());
  EXPECT_EQ(no_eq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(no_eq.status().message(), "t.conf:2")) << no_eq.status();

  auto twice = ParseConfigText("a=1\na=2\n", "t.conf");
  ASSERT_FALSE(twice.ok());
  EXPECT_TRUE(absl::StrContains(twice.status().message(), "set twice")) << twice.status();

  EXPECT_FALSE(ParseConfigText("= 3\n", "t.conf").ok());
}

TEST(ConfigFlags, AppliesValuesAndNamesUnknownOrBadOnes) {
  auto entries = ParseConfigText("test_port = 7000\ntest_name = trainer\ntest_enabled = true\n", "t.conf");
  ASSERT_TRUE(entries.ok());
  ASSERT_TRUE(ApplyConfigToFlags(*entries, "t.conf").ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_port), 7000);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "trainer");
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_enabled));

  auto unknown = ParseConfigText("no_such_flag = 1\n", "u.conf");
  absl::Status s = ApplyConfigToFlags(*unknown, "u.conf");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "u.conf:1: unknown flag `no_such_flag`")) << s;

  auto bad = ParseConfigText("test_port = seven\n", "b.conf");
  s = ApplyConfigToFlags(*bad, "b.conf");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "bad value `seven`")) << s;
}

TEST(ConfigFlags, CommandLineOverridesFile) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/svc.conf";
  {
    std::ofstream out(path);
    out << "test_port = 7000\ntest_name = from_file\n";
  }
  std::string config_arg = "--config=" + path;
  std::string port_arg = "--test_port=7001";
  char prog[] = "prog";
  char positional[] = "extra";
  char* argv[] = {prog, config_arg.data(), port_arg.data(), positional};
  std::vector<std::string> rest = ParseFlagsWithConfig(4, argv, "test");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_port), 7001);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "from_file");
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[1], "extra");
}

TEST(ConfigFile, MissingFileIsNotFound) {
  auto r = ReadConfigFile("/nonexistent/rlfleet.conf");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rlfleet::common
