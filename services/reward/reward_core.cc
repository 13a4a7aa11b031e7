#include "services/reward/reward_core.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/tasks/math_answer.h"
#include "libs/tasks/tasks.h"

namespace rlfleet::reward {
namespace {

constexpr float kFormatPenalty = -0.1f;
constexpr float kPartialWeight = 0.8f;

// The reference answer: the item's, or the task's own solution of the prompt.
absl::StatusOr<std::string> Reference(const tasks::Task& task, const v1::ScoreItem& item) {
  if (!item.reference_answer().empty()) return item.reference_answer();
  return task.Solve(item.prompt_text());
}

float PositionsRight(const std::string& answer, const std::string& response) {
  const size_t n = std::max(answer.size(), response.size());
  if (n == 0) return 1.0f;
  size_t right = 0;
  for (size_t i = 0; i < std::min(answer.size(), response.size()); ++i) right += answer[i] == response[i];
  return static_cast<float>(right) / static_cast<float>(n);
}

RewardFn Exact(const tasks::Task* task) {
  return [task](const v1::ScoreItem& item, v1::ScoreResult* result) -> absl::Status {
    ASSIGN_OR_RETURN(std::string answer, Reference(*task, item));
    const bool exact = task->FinalAnswer(item.response_text()) == answer;
    result->set_parsed(task->WellFormed(item.response_text()));
    result->set_reward(exact ? 1.0f : 0.0f);
    (*result->mutable_components())["exact"] = exact ? 1.0f : 0.0f;
    return absl::OkStatus();
  };
}

RewardFn PartialCredit(const tasks::Task* task) {
  return [task](const v1::ScoreItem& item, v1::ScoreResult* result) -> absl::Status {
    ASSIGN_OR_RETURN(std::string answer, Reference(*task, item));
    const std::string& response = item.response_text();
    const bool well_formed = task->WellFormed(response);
    const bool exact = task->FinalAnswer(response) == answer;
    // Partial credit against what a perfect policy writes: for a task with a tool, the
    // call and its result too (the answer alone when the prompt is not the task's own).
    absl::StatusOr<std::string> ideal = task->Demonstration(item.prompt_text());
    const float partial = PositionsRight(ideal.ok() ? *ideal : answer, response);
    auto& c = *result->mutable_components();
    c["exact"] = exact ? 1.0f : 0.0f;
    c["partial"] = partial;
    c["format"] = well_formed ? 1.0f : 0.0f;
    result->set_parsed(well_formed);
    // A malformed response still earns its partial credit, minus the penalty: a flat
    // penalty gives every sample of an untrained policy the same reward, and GRPO then
    // has no signal at all (every group has zero variance).
    result->set_reward(exact ? 1.0f : kPartialWeight * partial + (well_formed ? 0.0f : kFormatPenalty));
    return absl::OkStatus();
  };
}

// The reference answer of a math item: what its reference_answer states (a GSM8K
// solution's "#### n", a box), else the whole of it. INVALID_ARGUMENT when absent.
absl::StatusOr<std::string> MathReference(const v1::ScoreItem& item) {
  if (item.reference_answer().empty()) {
    return absl::InvalidArgumentError("reference_answer is required for task `math` (the dataset's answer)");
  }
  const std::string& reference = item.reference_answer();
  auto stated = tasks::ExtractMathAnswer(reference);
  if (stated.has_value() && stated->how != "last_number") return stated->text;
  return reference;
}

// metadata["tolerance"]: the relative tolerance of a numeric match (default 1e-6).
absl::StatusOr<double> MathTolerance(const v1::ScoreItem& item) {
  auto it = item.metadata().find("tolerance");
  if (it == item.metadata().end()) return 1e-6;
  double tolerance;
  if (!absl::SimpleAtod(it->second, &tolerance) || !(tolerance >= 0) || tolerance > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata[\"tolerance\"] `", it->second, "` is not a number in [0, 1]"));
  }
  return tolerance;
}

// 1 if the answer the response states (a box, GSM8K's ####, else its last number)
// matches the reference (normal form, or numerically within the tolerance).
absl::Status MathExact(const v1::ScoreItem& item, v1::ScoreResult* result) {
  ASSIGN_OR_RETURN(const std::string reference, MathReference(item));
  ASSIGN_OR_RETURN(const double tolerance, MathTolerance(item));
  auto stated = tasks::ExtractMathAnswer(item.response_text());
  const bool exact = stated.has_value() && tasks::MathAnswersMatch(stated->text, reference, tolerance);
  const bool formatted = stated.has_value() && stated->how != "last_number";
  auto& c = *result->mutable_components();
  c["exact"] = exact ? 1.0f : 0.0f;
  c["format"] = formatted ? 1.0f : 0.0f;
  result->set_parsed(stated.has_value());
  result->set_reward(exact ? 1.0f : 0.0f);
  return absl::OkStatus();
}

// 1 if the response states its answer in a recognised form (a box or GSM8K's ####).
absl::Status MathFormat(const v1::ScoreItem& item, v1::ScoreResult* result) {
  auto stated = tasks::ExtractMathAnswer(item.response_text());
  const bool formatted = stated.has_value() && stated->how != "last_number";
  (*result->mutable_components())["format"] = formatted ? 1.0f : 0.0f;
  result->set_parsed(stated.has_value());
  result->set_reward(formatted ? 1.0f : 0.0f);
  return absl::OkStatus();
}

}  // namespace

RewardCore::RewardCore() {
  {
    v1::RewardFunctionInfo exact;
    exact.set_name("math_exact");
    exact.set_kind(v1::REWARD_KIND_VERIFIABLE);
    exact.set_description(
        "1 if the answer the response states (its last \\boxed{}, else GSM8K's ####, else its last number) "
        "matches reference_answer (normal form, or numerically within metadata tolerance, default 1e-6 "
        "relative), else 0");
    exact.add_tasks("math");
    exact.add_component_names("exact");
    exact.add_component_names("format");
    exact.set_min_reward(0);
    exact.set_max_reward(1);
    (void)Register(exact, MathExact, /*default_for_tasks=*/true);
    v1::RewardFunctionInfo format;
    format.set_name("math_format");
    format.set_kind(v1::REWARD_KIND_VERIFIABLE);
    format.set_description("1 if the response states its answer in \\boxed{} or after GSM8K's ####, else 0");
    format.add_tasks("math");
    format.add_component_names("format");
    format.set_min_reward(0);
    format.set_max_reward(1);
    (void)Register(format, MathFormat);
  }
  for (const std::string& name : tasks::TaskNames()) {
    const tasks::Task* task = tasks::FindTask(name);
    v1::RewardFunctionInfo exact;
    exact.set_name(name + "_exact");
    exact.set_kind(v1::REWARD_KIND_VERIFIABLE);
    exact.set_description(absl::StrCat("1 if the response is the answer to `", task->description(), "`, else 0"));
    exact.add_tasks(name);
    exact.add_component_names("exact");
    exact.set_min_reward(0);
    exact.set_max_reward(1);
    (void)Register(exact, Exact(task));

    v1::RewardFunctionInfo partial;
    partial.set_name(name + "_partial_credit");
    partial.set_kind(v1::REWARD_KIND_VERIFIABLE);
    partial.set_description(
        "1 if exact, else 0.8 x fraction of positions right, minus 0.1 if not in the answer's form");
    partial.add_tasks(name);
    for (const char* c : {"exact", "partial", "format"}) partial.add_component_names(c);
    partial.set_min_reward(kFormatPenalty);
    partial.set_max_reward(1);
    (void)Register(partial, PartialCredit(task), /*default_for_tasks=*/true);
  }
}

absl::Status RewardCore::Register(v1::RewardFunctionInfo info, RewardFn fn, bool default_for_tasks) {
  if (info.name().empty()) return absl::InvalidArgumentError("reward function name is empty");
  absl::MutexLock lock(&mu_);
  if (functions_.count(info.name())) {
    return absl::AlreadyExistsError(absl::StrCat("reward function `", info.name(), "` exists"));
  }
  if (default_for_tasks) {
    for (const std::string& task : info.tasks()) default_for_task_[task] = info.name();
  }
  const std::string name = info.name();
  functions_[name] = Entry{std::move(info), std::move(fn)};
  return absl::OkStatus();
}

absl::Status RewardCore::ResolveLocked(const v1::ScoreItem& item, int index, std::string* name, RewardFn* fn) {
  const std::string where = absl::StrCat("items[", index, "]");
  if (item.prompt_text().empty() || item.response_text().size() > kMaxTextBytes ||
      item.prompt_text().size() > kMaxTextBytes || item.reference_answer().size() > kMaxTextBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": prompt_text is required (token ids need the shared tokenizer) and texts are at most ",
                     kMaxTextBytes, " bytes"));
  }
  if (item.item_id().size() > common::kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".item_id is ", item.item_id().size(), " bytes; the limit is ", common::kMaxIdBytes));
  }
  if (item.metadata_size() > kMaxMetadataEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".metadata has ", item.metadata_size(), " entries; the limit is ", kMaxMetadataEntries));
  }
  // The functions score text: token ids alone would be scored as an empty response.
  if (item.response_text().empty() && item.response_token_ids_size() > 0) {
    return absl::UnimplementedError(absl::StrCat(
        where, ".response_token_ids: this reward service scores text; send response_text (it does not detokenize)"));
  }
  *name = item.reward_function();
  if (name->empty()) {
    auto d = default_for_task_.find(item.task());
    if (d == default_for_task_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".task `", item.task(), "` has no default reward function"));
    }
    *name = d->second;
  }
  auto f = functions_.find(*name);
  if (f == functions_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".reward_function `", *name, "` is unknown"));
  }
  const auto& tasks = f->second.info.tasks();
  if (!tasks.empty() && std::find(tasks.begin(), tasks.end(), item.task()) == tasks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": `", *name, "` does not score task `", item.task(), "`"));
  }
  *fn = f->second.fn;
  return absl::OkStatus();
}

absl::Status RewardCore::Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) {
  const absl::Time start = absl::Now();
  if (request.items_size() == 0) return absl::InvalidArgumentError("items is empty");
  if (request.items_size() > kMaxItemsPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("items has ", request.items_size(), " entries; the limit is ", kMaxItemsPerRequest));
  }
  // Every item checked and its function found under one reader lock (not one lock per
  // item: the gRPC threads scoring at once would queue on it), then scored outside it.
  std::vector<std::pair<std::string, RewardFn>> functions(request.items_size());  // name, function
  {
    absl::ReaderMutexLock lock(&mu_);
    for (int i = 0; i < request.items_size(); ++i) {
      RETURN_IF_ERROR(ResolveLocked(request.items(i), i, &functions[i].first, &functions[i].second));
    }
  }
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::ScoreItem& item = request.items(i);
    const std::string where = absl::StrCat("items[", i, "]");
    const std::string& name = functions[i].first;
    const RewardFn& fn = functions[i].second;
    v1::ScoreResult* result = response->add_results();
    result->set_item_id(item.item_id());
    result->set_reward_function(name);
    absl::Status s = fn(item, result);
    if (!s.ok()) return common::Annotate(s, where);
    // A NaN reward passes every `<` check downstream and turns every advantage of its
    // group into NaN: a function (a diverged reward model) that produced one fails the
    // call, naming the item and the field, instead of answering with it.
    // (the field's name built only for a value that is not finite: Score's hot path)
    absl::Status finite;
    if (!std::isfinite(result->reward())) {
      finite = common::CheckFinite(absl::StrCat(where, ".reward"), result->reward());
    }
    for (const auto& [component, value] : result->components()) {
      if (!finite.ok()) break;
      if (std::isfinite(value)) continue;
      finite = common::CheckFinite(absl::StrCat(where, ".components[\"", component, "\"]"), value);
    }
    if (!finite.ok()) {
      return absl::InternalError(absl::StrCat("reward function `", name, "` answered ", finite.message()));
    }
  }
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status RewardCore::List(const v1::ListRewardFunctionsRequest& request,
                              v1::ListRewardFunctionsResponse* response) {
  // Pages in name order; a page token is the last name of the page before.
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("page.page_size", request.page().page_size(), 0, 1000));
  const size_t page_size = request.page().page_size() == 0 ? 100 : request.page().page_size();
  absl::MutexLock lock(&mu_);
  auto it = functions_.begin();
  if (!request.page().page_token().empty()) {
    it = functions_.find(request.page().page_token());
    if (it == functions_.end()) {
      return absl::InvalidArgumentError("page.page_token is not one this server issued (or its function is gone)");
    }
    ++it;
  }
  for (; it != functions_.end(); ++it) {
    const auto& tasks = it->second.info.tasks();
    if (!request.task().empty() && std::find(tasks.begin(), tasks.end(), request.task()) == tasks.end()) {
      continue;
    }
    if (static_cast<size_t>(response->functions_size()) == page_size) {
      response->set_next_page_token(response->functions(response->functions_size() - 1).name());
      break;
    }
    *response->add_functions() = it->second.info;
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::reward
