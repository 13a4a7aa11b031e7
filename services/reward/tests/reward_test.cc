// RewardCore's rewards, checked by hand, and the gRPC adapter on a loopback server.
#include <grpcpp/create_channel.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/rpc/server_runner.h"
#include "services/reward/reward_core.h"
#include "services/reward/reward_service.h"

namespace rlfleet::reward {
namespace {

v1::ScoreItem Item(const std::string& task, const std::string& prompt, const std::string& response,
                   const std::string& function = "") {
  v1::ScoreItem item;
  item.set_item_id(prompt + "|" + response);
  item.set_task(task);
  item.set_prompt_text(prompt);
  item.set_response_text(response);
  item.set_reward_function(function);
  return item;
}

v1::ScoreResult ScoreOne(RewardCore& core, const v1::ScoreItem& item) {
  v1::ScoreRequest request;
  *request.add_items() = item;
  v1::ScoreResponse response;
  absl::Status s = core.Score(request, &response);
  EXPECT_TRUE(s.ok()) << s;
  return response.results_size() == 1 ? response.results(0) : v1::ScoreResult();
}

TEST(RewardCore, PartialCreditIsTheDefaultAndScoresByHand) {
  RewardCore core;
  v1::ScoreResult exact = ScoreOne(core, Item("reverse", "reverse:1234", "4321"));
  EXPECT_EQ(exact.reward_function(), "reverse_partial_credit");
  EXPECT_FLOAT_EQ(exact.reward(), 1.0f);
  EXPECT_TRUE(exact.parsed());
  // 4321 vs 4301: 3 of 4 positions right -> 0.8 * 0.75.
  v1::ScoreResult partial = ScoreOne(core, Item("reverse", "reverse:1234", "4301"));
  EXPECT_FLOAT_EQ(partial.reward(), 0.6f);
  EXPECT_FLOAT_EQ(partial.components().at("partial"), 0.75f);
  EXPECT_FLOAT_EQ(partial.components().at("exact"), 0.0f);
  // Too long: 4 right of max(4, 6) positions.
  EXPECT_FLOAT_EQ(ScoreOne(core, Item("reverse", "reverse:1234", "432100")).reward(), 0.8f * 4 / 6);
  // Not digits: partial credit (3 of 4 right) minus the format penalty, not parsed.
  v1::ScoreResult garbage = ScoreOne(core, Item("reverse", "reverse:1234", "43x1"));
  EXPECT_FLOAT_EQ(garbage.reward(), 0.8f * 0.75f - 0.1f);
  EXPECT_FALSE(garbage.parsed());
  EXPECT_FLOAT_EQ(ScoreOne(core, Item("add", "add:17+25", "42")).reward(), 1.0f);
  EXPECT_FLOAT_EQ(ScoreOne(core, Item("sort", "sort:312", "123", "sort_exact")).reward(), 1.0f);
  EXPECT_FLOAT_EQ(ScoreOne(core, Item("sort", "sort:312", "132", "sort_exact")).reward(), 0.0f);
}

// Task `math`: the answer the response states against the dataset's reference.
TEST(RewardCore, MathScoresTheStatedAnswerAgainstTheReference) {
  RewardCore core;
  auto math = [&](const std::string& response, const std::string& reference, const std::string& fn = "") {
    v1::ScoreItem item = Item("math", "Natalia sold clips...", response, fn);
    item.set_reference_answer(reference);
    return ScoreOne(core, item);
  };
  v1::ScoreResult boxed = math("48/2 = 24, and 48 + 24 = \\boxed{72}", "She sold 72 clips.\n#### 72");
  EXPECT_EQ(boxed.reward_function(), "math_exact");  // (the default for math)
  EXPECT_FLOAT_EQ(boxed.reward(), 1.0f);
  EXPECT_FLOAT_EQ(boxed.components().at("format"), 1.0f);
  EXPECT_FLOAT_EQ(math("so it is 1,000 in all", "1000").reward(), 1.0f);  // (the last number)
  EXPECT_FLOAT_EQ(math("so it is 1,000 in all", "1000").components().at("format"), 0.0f);
  EXPECT_FLOAT_EQ(math("#### 0.5", "\\frac{1}{2}").reward(), 1.0f);
  EXPECT_FLOAT_EQ(math("\\boxed{73}", "72").reward(), 0.0f);
  v1::ScoreResult none = math("I do not know", "72");
  EXPECT_FLOAT_EQ(none.reward(), 0.0f);
  EXPECT_FALSE(none.parsed());
  EXPECT_FLOAT_EQ(math("\\boxed{7}", "72", "math_format").reward(), 1.0f);
  EXPECT_FLOAT_EQ(math("7", "72", "math_format").reward(), 0.0f);
  // Tolerance from metadata; a bad one and a missing reference are errors naming them.
  v1::ScoreItem loose = Item("math", "pi?", "\\boxed{3.14}");
  loose.set_reference_answer("3.14159");
  EXPECT_FLOAT_EQ(ScoreOne(core, loose).reward(), 0.0f);
  (*loose.mutable_metadata())["tolerance"] = "0.001";
  EXPECT_FLOAT_EQ(ScoreOne(core, loose).reward(), 1.0f);
  (*loose.mutable_metadata())["tolerance"] = "lots";
  v1::ScoreRequest request;
  *request.add_items() = loose;
  v1::ScoreResponse response;
  absl::Status s = core.Score(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "tolerance")) << s;
  request.mutable_items(0)->clear_reference_answer();
  request.mutable_items(0)->clear_metadata();
  s = core.Score(request, &response);
  EXPECT_TRUE(absl::StrContains(s.message(), "reference_answer is required")) << s;
}

TEST(RewardCore, ReferenceAnswerOverridesTheSolver) {
  RewardCore core;
  v1::ScoreItem item = Item("reverse", "reverse:1234", "9999");
  item.set_reference_answer("9999");
  EXPECT_FLOAT_EQ(ScoreOne(core, item).reward(), 1.0f);
}

TEST(RewardCore, UserFunctionsRegisterByName) {
  RewardCore core;
  v1::RewardFunctionInfo info;
  info.set_name("length_bonus");
  info.add_tasks("reverse");
  ASSERT_TRUE(core.Register(info,
                            [](const v1::ScoreItem& item, v1::ScoreResult* r) {
                              r->set_reward(static_cast<float>(item.response_text().size()));
                              return absl::OkStatus();
                            })
                  .ok());
  EXPECT_EQ(core.Register(info, nullptr).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FLOAT_EQ(ScoreOne(core, Item("reverse", "reverse:12", "abc", "length_bonus")).reward(), 3.0f);
  v1::ListRewardFunctionsRequest list;
  list.set_task("reverse");
  v1::ListRewardFunctionsResponse functions;
  ASSERT_TRUE(core.List(list, &functions).ok());
  EXPECT_EQ(functions.functions_size(), 3);  // exact, partial credit, length_bonus
}

TEST(RewardCore, BadItemsNameTheItemAndTheProblem) {
  RewardCore core;
  v1::ScoreRequest request;
  v1::ScoreResponse response;
  EXPECT_EQ(core.Score(request, &response).code(), absl::StatusCode::kInvalidArgument);
  *request.add_items() = Item("reverse", "reverse:12", "21");
  *request.add_items() = Item("juggle", "juggle:1", "1");
  absl::Status s = core.Score(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "items[1].task `juggle`")) << s;
  request.mutable_items(1)->set_task("sort");
  request.mutable_items(1)->set_reward_function("reverse_exact");
  s = core.Score(request, &response);
  EXPECT_TRUE(absl::StrContains(s.message(), "does not score task `sort`")) << s;
  request.mutable_items(1)->set_reward_function("");
  request.mutable_items(1)->set_prompt_text("reverse:12");  // wrong task prefix
  s = core.Score(request, &response);
  EXPECT_TRUE(absl::StrContains(s.message(), "items[1]")) << s;
  v1::ScoreRequest big;
  for (int i = 0; i <= kMaxItemsPerRequest; ++i) *big.add_items() = Item("reverse", "reverse:1", "1");
  EXPECT_TRUE(absl::StrContains(core.Score(big, &response).message(), "limit is 1024"));
}

// Limits the contract states are enforced, and token ids the service would not read
// are refused rather than scored as an empty response.
TEST(RewardCore, ContractLimitsAndUnreadFieldsAreRefused) {
  RewardCore core;
  v1::ScoreResponse response;
  auto score = [&](const v1::ScoreItem& item) {
    v1::ScoreRequest request;
    *request.add_items() = item;
    return core.Score(request, &response);
  };
  v1::ScoreItem long_id = Item("reverse", "reverse:12", "21");
  long_id.set_item_id(std::string(129, 'i'));
  EXPECT_TRUE(absl::StrContains(score(long_id).message(), "items[0].item_id")) << score(long_id);
  v1::ScoreItem metadata = Item("reverse", "reverse:12", "21");
  for (int i = 0; i <= kMaxMetadataEntries; ++i) (*metadata.mutable_metadata())[absl::StrCat("k", i)] = "v";
  EXPECT_TRUE(absl::StrContains(score(metadata).message(), "items[0].metadata")) << score(metadata);
  v1::ScoreItem ids_only = Item("reverse", "reverse:12", "");
  ids_only.add_response_token_ids(-5);
  absl::Status unread = score(ids_only);
  EXPECT_EQ(unread.code(), absl::StatusCode::kUnimplemented) << unread;
  EXPECT_TRUE(absl::StrContains(unread.message(), "items[0].response_token_ids")) << unread;
}

TEST(RewardCore, FunctionsListInPages) {
  RewardCore core;
  v1::ListRewardFunctionsRequest request;
  v1::ListRewardFunctionsResponse all;
  ASSERT_TRUE(core.List(request, &all).ok());
  ASSERT_GE(all.functions_size(), 3);
  EXPECT_TRUE(all.next_page_token().empty());
  request.mutable_page()->set_page_size(2);
  std::vector<std::string> paged;
  for (int pages = 0; pages < 100; ++pages) {
    v1::ListRewardFunctionsResponse page;
    ASSERT_TRUE(core.List(request, &page).ok());
    EXPECT_LE(page.functions_size(), 2);
    for (const auto& f : page.functions()) paged.push_back(f.name());
    if (page.next_page_token().empty()) break;
    request.mutable_page()->set_page_token(page.next_page_token());
  }
  ASSERT_EQ(paged.size(), static_cast<size_t>(all.functions_size()));
  for (int i = 0; i < all.functions_size(); ++i) EXPECT_EQ(paged[i], all.functions(i).name());
  v1::ListRewardFunctionsResponse ignored;
  request.mutable_page()->set_page_token("garbage");
  EXPECT_EQ(core.List(request, &ignored).code(), absl::StatusCode::kInvalidArgument);
  request.mutable_page()->clear_page_token();
  request.mutable_page()->set_page_size(1001);
  EXPECT_EQ(core.List(request, &ignored).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RewardService, ScoresOverGrpcWithAuth) {
  RewardCore core;
  RewardServiceImpl service(&core, rpc::CallAuth{"tok"});
  rpc::ServerOptions options;
  options.auth.token = "tok";
  rpc::ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::RewardService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  v1::ScoreRequest request;
  *request.add_items() = Item("add", "add:2+2", "4");
  v1::ScoreResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    EXPECT_EQ(stub->Score(&context, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  context.AddMetadata("authorization", "Bearer tok");
  grpc::Status status = stub->Score(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_FLOAT_EQ(response.results(0).reward(), 1.0f);
  request.mutable_items(0)->set_task("juggle");
  grpc::ClientContext bad;
  bad.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  bad.AddMetadata("authorization", "Bearer tok");
  status = stub->Score(&bad, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "juggle"));
}

// A reward function that produces NaN or infinity (a diverged reward model) fails the
// Score call naming the item and the field; no NaN reaches the buffer's advantages.
TEST(RewardService, ANonFiniteRewardIsNeverAnswered) {
  RewardCore core;
  for (const auto& [name, reward, component] : std::vector<std::tuple<std::string, float, float>>{
           {"nan_reward", std::nanf(""), 0.0f}, {"inf_component", 1.0f, -INFINITY}}) {
    v1::RewardFunctionInfo info;
    info.set_name(name);
    const float r = reward, c = component;
    ASSERT_TRUE(core.Register(info,
                              [r, c](const v1::ScoreItem&, v1::ScoreResult* result) {
                                result->set_reward(r);
                                (*result->mutable_components())["value"] = c;
                                return absl::OkStatus();
                              })
                    .ok());
  }
  RewardServiceImpl service(&core, rpc::CallAuth{});
  rpc::ServerRunner runner(rpc::ServerOptions{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::RewardService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  for (const auto& [function, want] : std::vector<std::pair<std::string, std::string>>{
           {"nan_reward", "items[1].reward is nan"}, {"inf_component", "items[1].components[\"value\"] is -inf"}}) {
    v1::ScoreRequest request;
    *request.add_items() = Item("add", "add:2+2", "4");
    *request.add_items() = Item("add", "add:2+2", "4", function);
    v1::ScoreResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status status = stub->Score(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), want)) << status.error_message();
    EXPECT_EQ(response.results_size(), 0);
  }
}

}  // namespace
}  // namespace rlfleet::reward
