// `rlfleet tokenize --chat` as a user runs it: a model directory with tokenizer.json and
// a tokenizer_config.json carrying Qwen2.5's chat template; the conversation in a JSON
// file renders to what jinja2 renders with transformers' settings (the fixture), and
// its ids are that text's ids. Bad files are refused with a message naming the problem.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "libs/model/hf_tokenizer.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using testing::Exited;
using testing::RunfilePath;

Exited Tokenize(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {"services/controller/rlfleet", "tokenize"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return testing::RunToExit(argv);
}

class TokenizeChat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(std::getenv("TEST_TMPDIR")) + "/model";
    fs::create_directories(dir_);
    fs::copy_file(RunfilePath("libs/model/testdata/hf/tokenizer_qwen2/tokenizer.json"), dir_ + "/tokenizer.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(RunfilePath("libs/model/testdata/chat/tokenizer_config.json"), dir_ + "/tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
    std::ifstream in(RunfilePath("libs/model/testdata/chat/expected.json"));
    std::stringstream text;
    text << in.rdbuf();
    for (const auto& c : Json::parse(text.str())) {
      if (c["template"] == "qwen2_5.jinja") cases_.push_back(c);
    }
    ASSERT_GE(cases_.size(), 5u);
  }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/../" + name;
    std::ofstream(path) << content;
    return path;
  }

  std::string dir_;
  std::vector<Json> cases_;
};

TEST_F(TokenizeChat, PrintsTheTemplatesTextAndItsIds) {
  auto tokenizer = model::HfTokenizer::FromFile(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (const Json& c : cases_) {
    SCOPED_TRACE(c["name"].get<std::string>());
    // The object form when the case has tools, the bare array otherwise.
    Json file = c["messages"];
    if (c.contains("tools")) file = Json{{"messages", c["messages"]}, {"tools", c["tools"]}};
    const std::string chat = Write(c["name"].get<std::string>() + ".json", file.dump());
    std::vector<std::string> flags = {"--model_dir=" + dir_, "--chat=" + chat};
    if (c["add_generation_prompt"].get<bool>()) flags.push_back("--add_generation_prompt");
    flags.push_back("--chat_text");
    const Exited text = Tokenize(flags);
    ASSERT_EQ(text.code, 0) << text.output;
    EXPECT_EQ(text.output, c["output"].get<std::string>());

    flags.pop_back();
    const Exited ids = Tokenize(flags);
    ASSERT_EQ(ids.code, 0) << ids.output;
    auto want = (*tokenizer)->Encode(c["output"].get<std::string>());
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(ids.output, "[" + absl::StrJoin(*want, ", ") + "]\n");
    // The special tokens of the template come out whole.
    EXPECT_TRUE(absl::StrContains(ids.output, std::to_string(*(*tokenizer)->TokenId("<|im_start|>"))));
  }
}

TEST_F(TokenizeChat, RefusesBadInputNamingIt) {
  const Exited not_json = Tokenize({"--model_dir=" + dir_, "--chat=" + Write("bad.json", "[{\"role\": ")});
  EXPECT_NE(not_json.code, 0);
  EXPECT_TRUE(absl::StrContains(not_json.output, "is not JSON")) << not_json.output;

  const Exited no_role = Tokenize({"--model_dir=" + dir_, "--chat=" + Write("norole.json", "[{\"content\": \"x\"}]")});
  EXPECT_NE(no_role.code, 0);
  EXPECT_TRUE(absl::StrContains(no_role.output, "message 0")) << no_role.output;

  const Exited no_messages = Tokenize({"--model_dir=" + dir_, "--chat=" + Write("obj.json", "{\"tools\": []}")});
  EXPECT_NE(no_messages.code, 0);
  EXPECT_TRUE(absl::StrContains(no_messages.output, "without \"messages\"")) << no_messages.output;

  const Exited both = Tokenize({"--model_dir=" + dir_, "--chat=" + Write("x.json", "[]"), "--text=hi"});
  EXPECT_NE(both.code, 0);

  // A directory without a chat template.
  const std::string bare = dir_ + "/../bare";
  fs::create_directories(bare);
  fs::copy_file(dir_ + "/tokenizer.json", bare + "/tokenizer.json", fs::copy_options::overwrite_existing);
  const Exited none = Tokenize({"--model_dir=" + bare, "--chat=" + Write("ok.json", "[]")});
  EXPECT_NE(none.code, 0);
  EXPECT_TRUE(absl::StrContains(none.output, "has no chat template")) << none.output;

  // A template using a feature the renderer does not support names it and its line.
  std::ofstream(bare + "/chat_template.jinja") << "{% for m in messages %}\n{% include 'x' %}{% endfor %}";
  const Exited unsupported = Tokenize({"--model_dir=" + bare, "--chat=" + Write("ok.json", "[]")});
  EXPECT_NE(unsupported.code, 0);
  EXPECT_TRUE(absl::StrContains(unsupported.output, "line 2: the Jinja statement `include` is not supported"))
      << unsupported.output;
}

}  // namespace
}  // namespace rlfleet
