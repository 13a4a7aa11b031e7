// The Jinja renderer and chat templates against what jinja2 renders with transformers'
// settings (libs/model/reference/make_chat_fixtures.py made the fixtures): small
// templates one feature each, then the Qwen2.5, Qwen3 and Llama 3.2 templates over
// conversations with system prompts, multiple turns, tools, tool calls, reasoning and
// unicode.
#include "libs/model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "libs/model/jinja.h"

namespace rlfleet::model {
namespace {

using Json = nlohmann::ordered_json;

const char kChat[] = "libs/model/testdata/chat/";

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Json ReadJson(const std::string& path) { return Json::parse(ReadText(path)); }

std::string Render(absl::string_view source, const Json& variables) {
  auto t = JinjaTemplate::Parse(source, "test");
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  auto out = (*t)->Render(variables);
  if (!out.ok()) return "RENDER ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(Jinja, RendersWhatJinja2RendersForEachFeature) {
  const Json cases = ReadJson(std::string(kChat) + "jinja_cases.json");
  ASSERT_GE(cases.size(), 40u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string source = c["template"];
    auto t = JinjaTemplate::Parse(source, c["name"].get<std::string>());
    if (c.contains("error")) {
      if (t.ok()) {
        EXPECT_FALSE((*t)->Render(c["variables"]).ok()) << source;
      }
      continue;
    }
    ASSERT_TRUE(t.ok()) << t.status();
    auto out = (*t)->Render(c["variables"]);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c["output"].get<std::string>()) << source;
  }
}

TEST(Jinja, ErrorsNameTheTemplateTheLineAndTheFeature) {
  auto unsupported = JinjaTemplate::Parse("a\n{% include 'x.j2' %}", "t.jinja");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_TRUE(absl::StrContains(unsupported.status().message(), "t.jinja line 2")) << unsupported.status();
  EXPECT_TRUE(absl::StrContains(unsupported.status().message(), "`include` is not supported")) << unsupported.status();

  EXPECT_TRUE(absl::StrContains(Render("{{ 1 | wordwrap }}", Json::object()), "filter `wordwrap` is not supported"));
  EXPECT_TRUE(absl::StrContains(Render("{{ 1 is sameas(1) and 1 is escaped }}", Json::object()),
                                "test `escaped` is not supported"));
  EXPECT_TRUE(absl::StrContains(Render("\n\n{{ d.x.y }}", Json{{"d", Json::object()}}), "line 3"));
  EXPECT_TRUE(absl::StrContains(Render("{{ d.x.y }}", Json{{"d", Json::object()}}), "has no attribute 'x'"));
  EXPECT_TRUE(absl::StrContains(Render("{% if x %}", Json::object()), "ends inside a block"));
  EXPECT_TRUE(absl::StrContains(Render("{{ 'a' ", Json::object()), "never closed"));
  EXPECT_TRUE(absl::StrContains(Render("{{ raise_exception('no system role here') }}", Json::object()),
                                "raised: no system role here"));
  EXPECT_EQ(Render("{% for x in range(10000000) %}{% endfor %}", Json::object()).rfind("RENDER ERROR", 0), 0u);
  // Input the fuzzer found: nesting deep enough to overflow a recursive reader.
  EXPECT_TRUE(absl::StrContains(Render("{{ " + std::string(500, '[') + " }}", Json::object()), "nested more than"));
  EXPECT_TRUE(absl::StrContains(Render("{{ " + std::string(5000, '-') + "1 }}", Json::object()), "tokens"));
  std::string deep_ifs;
  for (int i = 0; i < 200; ++i) deep_ifs += "{% if true %}";
  EXPECT_TRUE(absl::StrContains(Render(deep_ifs, Json::object()), "nested more than"));
  EXPECT_EQ(Render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   Json::object())
                .rfind("RENDER ERROR", 0),
            0u);
  EXPECT_EQ(Render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", Json::object()).rfind("RENDER ERROR", 0), 0u);
}

// What a hostile or broken template can do to the engine: integer edge cases, huge
// repeats, self-holding namespaces, values nested without bound. Each is a render
// error naming the template's line, never a trap, a hang or a crash.
TEST(Jinja, ArithmeticAllocationAndNestingStayInBounds) {
  const auto error = [](absl::string_view source) {
    const std::string out = Render(source, Json::object());
    EXPECT_EQ(out.rfind("RENDER ERROR", 0), 0u) << source << " -> " << out.substr(0, 200);
    return out;
  };
  EXPECT_TRUE(absl::StrContains(error("{{ 9223372036854775807 + 1 }}"), "integer overflow"));
  EXPECT_TRUE(absl::StrContains(error("{{ -9223372036854775807 - 2 }}"), "integer overflow"));
  EXPECT_TRUE(absl::StrContains(error("{{ 4294967296 * 4294967296 }}"), "integer overflow"));
  EXPECT_TRUE(absl::StrContains(error("{{ (-9223372036854775807 - 1) // -1 }}"), "integer overflow"));
  EXPECT_EQ(Render("{{ (-9223372036854775807 - 1) % -1 }}", Json::object()), "0");
  EXPECT_EQ(
      Render("{{ -7 // 2 }} {{ -7 % 2 }} {{ 2 ** 62 }} {{ (-1) ** 9223372036854775807 }} {{ 0 ** 0 }}", Json::object()),
      "-4 1 4611686018427387904 -1 1");
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::StrContains(error("{{ 2 ** 1000000000000000000 }}"), "integer overflow"));
  EXPECT_TRUE(absl::StrContains(error("{{ 'ab' * 9223372036854775807 }}"), "bounds"));
  EXPECT_TRUE(absl::StrContains(error("{{ [1, 2] * 4611686018427387904 }}"), "bounds"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(
      Render("{% for i in range(9223372036854775800, 9223372036854775807, 4) %}{{ i }},{% endfor %}", Json::object()),
      "9223372036854775800,9223372036854775804,");
  // A namespace that would hold itself; a list wrapped in a list for every step.
  EXPECT_TRUE(absl::StrContains(error("{% set ns = namespace(x=0) %}{% set ns.x = ns %}{{ ns }}"), "itself"));
  EXPECT_TRUE(absl::StrContains(error("{% set ns = namespace(x=0) %}{% set ns.x = [[ns]] %}{{ ns }}"), "itself"));
  EXPECT_TRUE(absl::StrContains(
      error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
      "deeper than"));
  // JSON variables nested deeper than the engine's bound are undefined, not a crash.
  Json deep = Json::array();
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  EXPECT_EQ(Render("{{ d | tojson }}", Json{{"d", deep}}).rfind("RENDER ERROR", 0), 0u);
  EXPECT_EQ(Render("{{ d }}", Json{{"d", deep}}).substr(0, 3), "[[[");
  // Ordinary nesting still works.
  EXPECT_EQ(Render("{% set ns = namespace(x=[]) %}{% for i in range(3) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
                   Json::object()),
            "[[[[]]]]");
}

TEST(Jinja, StrftimeNowFormatsTheGivenTime) {
  auto t = JinjaTemplate::Parse("{{ strftime_now('%d %b %Y') }}", "t");
  ASSERT_TRUE(t.ok());
  auto out =
      (*t)->Render(Json::object(), absl::FromCivil(absl::CivilSecond(2024, 7, 26, 12, 0, 0), absl::LocalTimeZone()));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "26 Jul 2024");
}

TEST(ChatTemplate, QwenAndLlamaTemplatesRenderAsTransformersDoes) {
  const Json cases = ReadJson(std::string(kChat) + "expected.json");
  ASSERT_GE(cases.size(), 30u);
  int outputs = 0, errors = 0;
  for (const auto& c : cases) {
    const std::string file = c["template"];
    SCOPED_TRACE(file + " " + c["name"].get<std::string>());
    auto chat = ChatTemplate::FromText(ReadText(kChat + file), file, c["special_tokens"]);
    ASSERT_TRUE(chat.ok()) << chat.status();
    auto out = (*chat)->Apply(c["messages"], c["add_generation_prompt"].get<bool>(),
                              c.contains("tools") ? c["tools"] : Json(nullptr), c["kwargs"]);
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok());
      EXPECT_TRUE(absl::StrContains(out.status().message(), c["error"].get<std::string>())) << out.status();
      ++errors;
      continue;
    }
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c["output"].get<std::string>());
    ++outputs;
  }
  EXPECT_GE(outputs, 25);
  EXPECT_GE(errors, 1);
}

TEST(ChatTemplate, ReadsTheTemplateFromAModelDirectory) {
  auto chat = ChatTemplate::FromModelDir(kChat);  // tokenizer_config.json with Qwen2.5's template
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ((*chat)->special_tokens().value("eos_token", ""), "<|im_end|>");
  EXPECT_FALSE((*chat)->special_tokens().contains("bos_token"));  // null in the file
  auto out = (*chat)->Apply(Json::parse(R"([{"role": "user", "content": "Hello!"}])"), true);
  ASSERT_TRUE(out.ok()) << out.status();
  const Json cases = ReadJson(std::string(kChat) + "expected.json");
  EXPECT_EQ(*out, cases[0]["output"].get<std::string>());

  auto missing = ChatTemplate::FromModelDir("libs/model/testdata/hf/qwen2");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

TEST(ChatTemplate, RefusesAMalformedConversation) {
  auto chat = ChatTemplate::FromText("{{ messages[0].content }}", "t", Json::object());
  ASSERT_TRUE(chat.ok());
  EXPECT_FALSE((*chat)->Apply(Json::object(), false).ok());
  auto no_role = (*chat)->Apply(Json::parse(R"([{"content": "x"}])"), false);
  EXPECT_TRUE(absl::StrContains(no_role.status().message(), "message 0")) << no_role.status();
  EXPECT_FALSE((*chat)->Apply(Json::parse(R"([{"role": "user", "content": "x"}])"), false, Json("tools")).ok());
}

}  // namespace
}  // namespace rlfleet::model
