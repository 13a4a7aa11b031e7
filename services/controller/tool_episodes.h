// Multi-turn rollouts with a tool: the policy's turn ends at the tool's call token, the
// environment's answer is spliced into the response, and generation continues from
// there, up to kMaxToolTurns turns or the response cap. The whole trajectory is one
// Experience: every turn's tokens with their log-probabilities and versions, the tool's
// tokens with log-probability 0 and response_loss_mask false (out of the loss), the
// last turn's finish reason.
//
//   auto env = CalculatorEnvironment();
//   RETURN_IF_ERROR(GenerateEpisodes(*env, request, generate, &response));
//
// Thread-compatible (an environment is stateless).
#ifndef RLFLEET_SERVICES_CONTROLLER_TOOL_EPISODES_H_
#define RLFLEET_SERVICES_CONTROLLER_TOOL_EPISODES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "rlfleet/v1/rollout.pb.h"

namespace rlfleet::controller {

inline constexpr int kMaxToolTurns = 4;
// Prompts per continuation request (the rollout's GenerateBatch limit).
inline constexpr int kMaxContinuationPrompts = 256;

class ToolEnvironment {
 public:
  virtual ~ToolEnvironment() = default;
  // The token that ends a call (a turn's stop token).
  virtual int32_t call_end() const = 0;
  // The tokens answering the call at the end of `response` (which ends with call_end()).
  virtual std::vector<int32_t> Answer(const std::vector<int32_t>& response) const = 0;
};

// The built-in tokenizer's calculator (libs/tasks Calculate): "[37*4]" is answered
// "(148)", a malformed call "()".
std::unique_ptr<ToolEnvironment> CalculatorEnvironment();

// Runs `request` (its prompts x num_samples) as episodes with `env`'s tool through
// `generate` (one GenerateBatch; the caller's retries), answering as GenerateBatch does
// (prompt-major completions, generated_tokens summed over the turns). A turn's request
// asks for the call token as a stop token; continuations go out as one prompt per
// episode (the prompt and the response so far, num_samples 1, the seed advanced per
// turn), their cap the largest budget left, each episode then cut to its own. Errors:
// `generate`'s.
absl::Status GenerateEpisodes(
    const ToolEnvironment& env, const v1::GenerateBatchRequest& request,
    const std::function<absl::Status(const v1::GenerateBatchRequest&, v1::GenerateBatchResponse*)>& generate,
    v1::GenerateBatchResponse* out);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_TOOL_EPISODES_H_
