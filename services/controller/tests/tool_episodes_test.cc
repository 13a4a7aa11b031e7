#include "services/controller/tool_episodes.h"

#include <gtest/gtest.h>

#include <vector>

#include "libs/model/tokenizer.h"

namespace rlfleet::controller {
namespace {

using model::Tokenizer;

std::vector<int32_t> Ids(const std::string& text) {
  std::vector<int32_t> ids = *Tokenizer::EncodeResponse(text);
  ids.pop_back();  // (EOS)
  return ids;
}
std::vector<int32_t> Response(const v1::Experience& e) {
  return {e.response_token_ids().begin(), e.response_token_ids().end()};
}

// A replica that answers a first turn by the script's sample, and a continuation
// (a prompt that ends with a tool's answer) with what follows it.
struct ScriptedReplica {
  std::vector<std::string> first = {"[37*4]", "15"};  // per sample ("15" ends with EOS)
  std::string after = "148";
  std::vector<v1::GenerateBatchRequest> requests;

  absl::Status operator()(const v1::GenerateBatchRequest& r, v1::GenerateBatchResponse* out) {
    requests.push_back(r);
    for (const v1::BatchPrompt& p : r.prompts()) {
      for (uint32_t s = 0; s < std::max(1u, r.num_samples()); ++s) {
        const bool continuation = p.prompt_token_ids(p.prompt_token_ids_size() - 1) == Tokenizer::kEndResult;
        const std::string text = continuation ? after : first[s % first.size()];
        std::vector<int32_t> ids = Ids(text);
        const bool call = !ids.empty() && ids.back() == Tokenizer::kEndCall;
        if (!call) ids.push_back(Tokenizer::kEos);
        uint32_t cap = r.sampling().max_new_tokens();
        v1::Experience* e = out->add_completions();
        e->set_prompt_id(p.prompt_id());
        e->set_group_id(p.group_id());
        e->set_task(p.task());
        e->set_finish_reason(v1::FINISH_REASON_STOP);
        if (cap > 0 && ids.size() > cap) {
          ids.resize(cap);
          e->set_finish_reason(v1::FINISH_REASON_LENGTH);
        }
        for (int32_t t : ids) {
          e->add_response_token_ids(t);
          e->add_response_logprobs(-0.5f);
          e->add_token_policy_versions(continuation ? 4 : 3);
        }
        out->set_generated_tokens(out->generated_tokens() + ids.size());
      }
    }
    return absl::OkStatus();
  }
};

v1::GenerateBatchRequest Request(uint32_t samples, uint32_t max_new_tokens) {
  v1::GenerateBatchRequest r;
  r.set_request_id("r1");
  r.set_num_samples(samples);
  r.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  r.mutable_sampling()->set_seed(7);
  v1::BatchPrompt* p = r.add_prompts();
  p->set_prompt_id("p");
  p->set_group_id("g");
  p->set_task("mul");
  const std::vector<int32_t> prompt = *Tokenizer::EncodePrompt("mul:37*4");  // (not a range over a temporary)
  for (int32_t t : prompt) p->add_prompt_token_ids(t);
  return r;
}

TEST(ToolEpisodes, TheToolsAnswerIsSplicedInAndLeftOutOfTheLoss) {
  auto env = CalculatorEnvironment();
  ScriptedReplica replica;
  v1::GenerateBatchResponse out;
  ASSERT_TRUE(GenerateEpisodes(*env, Request(2, 30), std::ref(replica), &out).ok());
  ASSERT_EQ(out.completions_size(), 2);
  // Sample 0 called the calculator and answered from its result.
  const v1::Experience& tool = out.completions(0);
  EXPECT_EQ(Tokenizer::DecodeResponse(Response(tool)), "[37*4](148)148");
  ASSERT_EQ(tool.response_loss_mask_size(), tool.response_token_ids_size());
  ASSERT_EQ(tool.response_logprobs_size(), tool.response_token_ids_size());
  ASSERT_EQ(tool.token_policy_versions_size(), tool.response_token_ids_size());
  for (int i = 0; i < tool.response_token_ids_size(); ++i) {
    const bool from_tool = i >= 6 && i < 11;  // "(148)"
    EXPECT_EQ(tool.response_loss_mask(i), !from_tool) << i;
    EXPECT_EQ(tool.response_logprobs(i), from_tool ? 0.0f : -0.5f) << i;
    EXPECT_EQ(tool.token_policy_versions(i), i < 11 ? 3u : 4u) << i;
  }
  EXPECT_EQ(tool.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(tool.prompt_id(), "p");
  // Sample 1 answered at once: no mask, nothing spliced.
  EXPECT_EQ(Tokenizer::DecodeResponse(Response(out.completions(1))), "15");
  EXPECT_EQ(out.completions(1).response_loss_mask_size(), 0);
  EXPECT_EQ(out.generated_tokens(), 6u + 3u + 4u);  // the policy's tokens, not the tool's
  // The turns' requests: the call token stops a turn; the continuation is the prompt and
  // the response so far, one sample, the next seed.
  ASSERT_EQ(replica.requests.size(), 2u);
  EXPECT_EQ(replica.requests[0].sampling().stop_token_ids(0), Tokenizer::kEndCall);
  const v1::GenerateBatchRequest& more = replica.requests[1];
  EXPECT_EQ(more.num_samples(), 1u);
  EXPECT_EQ(more.sampling().seed(), 8u);
  ASSERT_EQ(more.prompts_size(), 1);
  EXPECT_EQ(more.prompts(0).prompt_token_ids_size(), 7 + 11);  // "mul:37*4" is 7 tokens
  EXPECT_EQ(more.sampling().max_new_tokens(), 30u - 11u);
}

TEST(ToolEpisodes, TheBudgetCoversEveryTurnAndABadCallGetsAnEmptyResult) {
  auto env = CalculatorEnvironment();
  ScriptedReplica replica;
  replica.first = {"[37*]"};
  v1::GenerateBatchResponse out;
  ASSERT_TRUE(GenerateEpisodes(*env, Request(1, 10), std::ref(replica), &out).ok());
  const v1::Experience& e = out.completions(0);
  EXPECT_EQ(Tokenizer::DecodeResponse(Response(e)), "[37*]()148");  // cut at 10 tokens
  EXPECT_EQ(e.response_token_ids_size(), 10);
  EXPECT_EQ(e.finish_reason(), v1::FINISH_REASON_LENGTH);
  // A call that never ends the episode: the turns run out.
  ScriptedReplica loop;
  loop.first = {"[1*2]"};
  loop.after = "[2*2]";
  v1::GenerateBatchResponse looped;
  ASSERT_TRUE(GenerateEpisodes(*env, Request(1, 100), std::ref(loop), &looped).ok());
  EXPECT_EQ(loop.requests.size(), static_cast<size_t>(kMaxToolTurns));
  EXPECT_EQ(Tokenizer::DecodeResponse(Response(looped.completions(0))), "[1*2](2)[2*2](4)[2*2](4)[2*2]");
}

TEST(ToolEpisodes, AGenerateErrorIsReturned) {
  auto env = CalculatorEnvironment();
  v1::GenerateBatchResponse out;
  int calls = 0;
  auto failing = [&](const v1::GenerateBatchRequest& r, v1::GenerateBatchResponse* o) -> absl::Status {
    if (++calls == 2) return absl::UnavailableError("replica gone");
    ScriptedReplica s;
    return s(r, o);
  };
  EXPECT_EQ(GenerateEpisodes(*env, Request(2, 30), failing, &out).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rlfleet::controller
