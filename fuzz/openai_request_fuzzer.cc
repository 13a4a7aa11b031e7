// libFuzzer harness: the gateway's OpenAI request parser (ParseGenerationRequest, both
// endpoints) over arbitrary bytes, and the text a stop string cuts (UpdateChoiceText).
// A refused request names an HTTP status of 4xx and a message; an accepted one is in
// range; no field is used before its type is checked (the backstop that turns such a
// use into a 400 counts as a crash here); the streamable prefix never passes the text
// nor shrinks.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "services/gateway/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using rlfleet::gateway::Endpoint;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    rlfleet::gateway::GenerationRequest request;
    auto error = rlfleet::gateway::ParseGenerationRequest(endpoint, bytes, "m", &request);
    if (error.has_value()) {
      if (error->status < 400 || error->status > 499 || error->message.empty()) std::abort();
      // (the parser's backstop caught a JSON exception: a field used before its type was checked)
      if (error->message.rfind("the request could not be read", 0) == 0) std::abort();
      (void)rlfleet::gateway::ErrorBody(*error);
      continue;
    }
    if (request.n < 1 || request.n > rlfleet::gateway::kMaxChoices) std::abort();
    if (!(request.temperature >= 0 && request.temperature <= 2) || !(request.top_p > 0 && request.top_p <= 1)) {
      std::abort();
    }
    if (request.stop.size() > rlfleet::gateway::kMaxStops) std::abort();
    // Grow a text by the input's bytes, checking what may be streamed at each length.
    rlfleet::gateway::ChoiceState choice;
    size_t last = 0;
    for (size_t n = 0; n <= bytes.size() && !choice.stopped; n += 1 + n / 8) {
      const size_t ready = rlfleet::gateway::UpdateChoiceText(choice, bytes.substr(0, n), request.stop, false);
      if (ready > choice.text.size() || ready < last) std::abort();
      choice.sent_chars = last = ready;
    }
  }
  return 0;
}
