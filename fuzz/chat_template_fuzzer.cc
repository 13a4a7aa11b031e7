// libFuzzer harness: the Jinja chat-template reader and renderer over arbitrary
// template text (a model directory's chat_template.jinja is input rlfleet did not
// write). Parse either succeeds or is INVALID_ARGUMENT; a parsed template renders a
// fixed conversation (tools, a tool call, unicode) to text or INVALID_ARGUMENT, within
// the renderer's bounds on steps, output and value sizes, never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "libs/model/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json* const variables = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "  Grüße 你好 🌍\n\t\"q\" "},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\nok", "reasoning_content": "hm",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1.5, "y": [true, null]}}}]},
      {"role": "tool", "content": "{\"r\": 2}"},
      {"role": "user", "content": [{"type": "text", "text": "parts"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>"
  })"));
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = rlfleet::model::JinjaTemplate::Parse(text, "fuzz.jinja");
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  auto out = (*parsed)->Render(*variables, absl::FromUnixSeconds(1721995200));
  if (!out.ok() && out.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
