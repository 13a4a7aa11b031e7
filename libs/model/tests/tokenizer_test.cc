#include "libs/model/tokenizer.h"

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/tasks/tasks.h"

namespace rlfleet::model {
namespace {

TEST(Tokenizer, PromptsAndResponsesRoundTrip) {
  auto ids = Tokenizer::EncodePrompt("reverse:1203");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), Tokenizer::kBos);
  EXPECT_EQ(ids->back(), Tokenizer::kSep);
  EXPECT_EQ(ids->size(), 7u);  // BOS, task, 4 digits, SEP
  EXPECT_EQ(Tokenizer::DecodePrompt(*ids), "reverse:1203");
  auto r = Tokenizer::EncodeResponse("-3021");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->back(), Tokenizer::kEos);
  EXPECT_EQ(Tokenizer::DecodeResponse(*r), "-3021");
  for (int32_t id : *ids) EXPECT_LT(id, Tokenizer::kVocabSize);
}

TEST(Tokenizer, EveryBuiltInTaskExampleEncodes) {
  absl::BitGen gen;
  for (const std::string& name : tasks::TaskNames()) {
    for (int i = 0; i < 50; ++i) {
      tasks::Example e = tasks::FindTask(name)->Make(gen, tasks::TaskOptions{});
      auto p = Tokenizer::EncodePrompt(e.prompt);
      ASSERT_TRUE(p.ok()) << e.prompt << ": " << p.status();
      EXPECT_EQ(Tokenizer::DecodePrompt(*p), e.prompt);
      auto a = Tokenizer::EncodeResponse(e.answer);
      ASSERT_TRUE(a.ok());
      EXPECT_EQ(Tokenizer::DecodeResponse(*a), e.answer);
    }
  }
}

TEST(Tokenizer, DecodeStopsAtEosAndMarksNonAnswerTokens) {
  EXPECT_EQ(Tokenizer::DecodeResponse({9, 10, Tokenizer::kSep, Tokenizer::kEos, 11}), "01?");
  auto bad = Tokenizer::EncodePrompt("reverse:12x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "`x` at byte 10")) << bad.status();
  EXPECT_EQ(Tokenizer::EncodePrompt("juggle:1").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Tokenizer, TheCalculatorsProtocolHasItsOwnTokens) {
  auto prompt = Tokenizer::EncodePrompt("mul:37*4");
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(Tokenizer::DecodePrompt(*prompt), "mul:37*4");
  auto response = Tokenizer::EncodeResponse("[37*4](148)148");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->front(), Tokenizer::kCall);
  EXPECT_EQ(response->at(5), Tokenizer::kEndCall);
  EXPECT_EQ(response->at(6), Tokenizer::kResult);
  EXPECT_EQ(response->at(10), Tokenizer::kEndResult);
  EXPECT_EQ(Tokenizer::DecodeResponse(*response), "[37*4](148)148");
  for (int32_t id : *response) EXPECT_LT(id, Tokenizer::kVocabSize);
}

}  // namespace
}  // namespace rlfleet::model
