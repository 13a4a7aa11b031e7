#include "services/controller/tool_episodes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/model/tokenizer.h"
#include "libs/tasks/tasks.h"

namespace rlfleet::controller {
namespace {

using model::Tokenizer;

class Calculator : public ToolEnvironment {
 public:
  int32_t call_end() const override { return Tokenizer::kEndCall; }
  std::vector<int32_t> Answer(const std::vector<int32_t>& response) const override {
    std::vector<int32_t> answer = {Tokenizer::kResult};
    const auto call = std::find(response.rbegin(), response.rend(), Tokenizer::kCall);
    if (call != response.rend() && !response.empty()) {
      // The tokens between the call and its end (the end is the response's last).
      const std::vector<int32_t> expression(call.base(), response.end() - 1);
      std::optional<std::string> value = tasks::Calculate(Tokenizer::DecodeResponse(expression));
      if (value.has_value()) {
        absl::StatusOr<std::vector<int32_t>> digits = Tokenizer::EncodeResponse(*value);
        if (digits.ok()) answer.insert(answer.end(), digits->begin(), digits->end() - 1);  // (less its EOS)
      }
    }
    answer.push_back(Tokenizer::kEndResult);
    return answer;
  }
};

// One trajectory as it grows.
struct Episode {
  size_t index = 0;  // in the first turn's completions
  std::vector<int32_t> prompt;
  bool tool_used = false;
};

bool EndsWithCall(const v1::Experience& e, int32_t call_end) {
  return e.finish_reason() == v1::FINISH_REASON_STOP && e.response_token_ids_size() > 0 &&
         e.response_token_ids(e.response_token_ids_size() - 1) == call_end;
}

// Appends `turn`'s tokens (the policy's: in the loss) to `e`, at most `budget` of them.
void AppendTurn(const v1::Experience& turn, int budget, v1::Experience* e) {
  const int n = std::min(turn.response_token_ids_size(), std::max(0, budget));
  for (int i = 0; i < n; ++i) {
    e->add_response_token_ids(turn.response_token_ids(i));
    e->add_response_logprobs(i < turn.response_logprobs_size() ? turn.response_logprobs(i) : 0.0f);
    e->add_token_policy_versions(i < turn.token_policy_versions_size() ? turn.token_policy_versions(i) : 0);
    if (e->response_loss_mask_size() > 0) e->add_response_loss_mask(true);
  }
  e->set_finish_reason(n < turn.response_token_ids_size() ? v1::FINISH_REASON_LENGTH : turn.finish_reason());
  e->set_created_at_unix_ms(turn.created_at_unix_ms());
}

// Appends the tool's answer (out of the loss) to `e`.
void AppendAnswer(const std::vector<int32_t>& answer, v1::Experience* e) {
  if (e->response_loss_mask_size() == 0) {
    for (int i = 0; i < e->response_token_ids_size(); ++i) e->add_response_loss_mask(true);
  }
  const uint64_t version =
      e->token_policy_versions_size() > 0 ? e->token_policy_versions(e->token_policy_versions_size() - 1) : 0;
  for (int32_t t : answer) {
    e->add_response_token_ids(t);
    e->add_response_logprobs(0.0f);
    e->add_token_policy_versions(version);
    e->add_response_loss_mask(false);
  }
}

}  // namespace

std::unique_ptr<ToolEnvironment> CalculatorEnvironment() { return std::make_unique<Calculator>(); }

absl::Status GenerateEpisodes(
    const ToolEnvironment& env, const v1::GenerateBatchRequest& request,
    const std::function<absl::Status(const v1::GenerateBatchRequest&, v1::GenerateBatchResponse*)>& generate,
    v1::GenerateBatchResponse* out) {
  v1::GenerateBatchRequest first = request;
  first.mutable_sampling()->add_stop_token_ids(env.call_end());
  RETURN_IF_ERROR(generate(first, out));
  const int budget = static_cast<int>(request.sampling().max_new_tokens());
  const int samples = std::max<int>(1, request.num_samples());
  uint64_t generated = out->generated_tokens();
  std::vector<Episode> open;
  for (int i = 0; i < out->completions_size(); ++i) {
    if (!EndsWithCall(out->completions(i), env.call_end())) continue;
    Episode e;
    e.index = static_cast<size_t>(i);
    const v1::BatchPrompt& p = request.prompts(i / samples);
    e.prompt.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
    open.push_back(std::move(e));
  }
  for (int turn = 1; turn < kMaxToolTurns && !open.empty(); ++turn) {
    // The tool answers each open episode; those with budget left continue.
    std::vector<Episode> next;
    int most_left = 0;
    for (Episode& e : open) {
      v1::Experience* x = out->mutable_completions(static_cast<int>(e.index));
      AppendAnswer(env.Answer({x->response_token_ids().begin(), x->response_token_ids().end()}), x);
      const int left = budget > 0 ? budget - x->response_token_ids_size() : 1 << 20;
      if (left <= 0) {
        x->set_finish_reason(v1::FINISH_REASON_LENGTH);
        continue;
      }
      most_left = std::max(most_left, left);
      next.push_back(std::move(e));
    }
    open.clear();
    for (size_t begin = 0; begin < next.size(); begin += kMaxContinuationPrompts) {
      const size_t end = std::min(next.size(), begin + kMaxContinuationPrompts);
      v1::GenerateBatchRequest more;
      more.set_request_id(absl::StrCat(request.request_id(), "-t", turn, "-", begin));
      *more.mutable_sampling() = first.sampling();
      if (budget > 0) more.mutable_sampling()->set_max_new_tokens(static_cast<uint32_t>(most_left));
      if (request.sampling().has_seed()) more.mutable_sampling()->set_seed(request.sampling().seed() + turn);
      more.set_num_samples(1);
      more.set_min_policy_version(request.min_policy_version());
      for (size_t k = begin; k < end; ++k) {
        const v1::Experience& x = out->completions(static_cast<int>(next[k].index));
        v1::BatchPrompt* p = more.add_prompts();
        p->set_prompt_id(x.prompt_id());
        p->set_group_id(x.group_id());
        p->set_task(x.task());
        for (int32_t t : next[k].prompt) p->add_prompt_token_ids(t);
        for (int32_t t : x.response_token_ids()) p->add_prompt_token_ids(t);
      }
      v1::GenerateBatchResponse continued;
      RETURN_IF_ERROR(generate(more, &continued));
      if (continued.completions_size() != static_cast<int>(end - begin)) {
        return absl::InternalError(absl::StrCat("GenerateBatch (turn ", turn + 1, "): ", continued.completions_size(),
                                                " completions for ", end - begin, " prompts"));
      }
      generated += continued.generated_tokens();
      for (size_t k = begin; k < end; ++k) {
        v1::Experience* x = out->mutable_completions(static_cast<int>(next[k].index));
        const v1::Experience& turn_out = continued.completions(static_cast<int>(k - begin));
        const int left = budget > 0 ? budget - x->response_token_ids_size() : 1 << 20;
        AppendTurn(turn_out, left, x);
        if (EndsWithCall(*x, env.call_end())) open.push_back(std::move(next[k]));
      }
    }
  }
  out->set_generated_tokens(generated);
  return absl::OkStatus();
}

}  // namespace rlfleet::controller
