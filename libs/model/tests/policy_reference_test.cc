// The C++ policy against a PyTorch reference of the same architecture reading the same
// safetensors file: logits agree to 1e-5 (fp32), and so do the weights after one
// TrainStep (loss, backward, gradient clipping and AdamW) and PyTorch's.
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"
#include "libs/model/tokenizer.h"
#include "tests/util/subprocess.h"

namespace rlfleet::model {
namespace {

std::vector<float> ParseFloats(const std::string& json) {
  std::vector<float> out;
  std::string cleaned = json;
  for (char& c : cleaned) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  for (absl::string_view tok : absl::StrSplit(cleaned, ' ', absl::SkipEmpty())) {
    float v = 0;
    if (absl::SimpleAtof(tok, &v)) out.push_back(v);
  }
  return out;
}

TEST(PolicyReference, LogitsMatchPyTorchToOneInAHundredThousand) {
  PolicyConfig config;
  config.vocab_size = 32;
  config.d_model = 64;
  config.n_layers = 3;
  config.n_heads = 4;
  config.max_seq_len = 24;
  auto policy = Policy::Create(config, "cpu", 11);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const std::string dir = getenv("TEST_TMPDIR");
  const std::string weights = dir + "/w.safetensors";
  ASSERT_TRUE((*policy)->SaveSafetensors(weights).ok());

  std::vector<std::vector<int32_t>> tokens = {{1, 4, 9, 10, 11, 12, 3, 13, 14, 2}, {0, 0, 0, 1, 6, 15, 7, 16, 3, 17}};
  std::vector<std::string> rows;
  for (const auto& r : tokens) rows.push_back(absl::StrCat("[", absl::StrJoin(r, ","), "]"));
  const std::string request =
      absl::StrCat("{\"weights\": \"", weights, "\", \"config\": {\"d_model\": 64, \"n_heads\": 4, \"n_layers\": 3}, ",
                   "\"tokens\": [", absl::StrJoin(rows, ","), "]}");
  std::ofstream(dir + "/request.json") << request;

  const std::string script = rlfleet::testing::RunfilePath("libs/model/reference/reference_policy.py");
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", script, " < ", dir, "/request.json > ", dir, "/logits.json");
  const int rc = std::system(command.c_str());
  ASSERT_EQ(rc, 0) << "the PyTorch reference failed (python3-torch installed? tools/setup.sh)";
  std::stringstream reference_json;
  reference_json << std::ifstream(dir + "/logits.json").rdbuf();
  std::vector<float> reference = ParseFloats(reference_json.str());

  auto ours = (*policy)->Logits(tokens);
  ASSERT_TRUE(ours.ok());
  ASSERT_EQ(ours->size(), reference.size());
  float worst = 0;
  for (size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, std::fabs((*ours)[i] - reference[i]));
  EXPECT_LT(worst, 1e-5f) << "max |ours - pytorch| over " << reference.size() << " logits";
  std::cout << "max abs logit difference vs PyTorch: " << worst << "\n";
}

// One GRPO step (clipped surrogate, entropy bonus, gradient clipping, AdamW from fresh
// state) against the same step written the plain way in PyTorch
// (reference_train_step.py check=): every weight after it agrees. The learning rate is
// large enough that the update is far above float noise, the gradient norm is above
// the clip, and AdamW's epsilon is 1e-3: a first update is lr * g / (|g| + eps), so
// with the default 1e-8 a gradient that is float noise (~1e-9) on one side moves its
// weight by a tenth of lr there and not at all on the other.
TEST(PolicyReference, ATrainStepUpdatesTheWeightsAsPyTorchDoes) {
  PolicyConfig config;
  config.vocab_size = 32;
  config.d_model = 32;
  config.n_layers = 2;
  config.n_heads = 4;
  config.max_seq_len = 24;
  auto policy = Policy::Create(config, "cpu", 5);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const std::string dir = getenv("TEST_TMPDIR");
  const std::string before = dir + "/before.safetensors", theirs = dir + "/theirs.safetensors",
                    ours = dir + "/ours.safetensors";
  ASSERT_TRUE((*policy)->SaveSafetensors(before).ok());
  constexpr int B = 6, P = 5, R = 7;
  std::vector<TrainSequence> batch(B);
  for (int b = 0; b < B; ++b) {  // (the tokens reference_train_step.py's check= makes)
    for (int i = 0; i < P + R; ++i) {
      (i < P ? batch[b].prompt : batch[b].response).push_back(4 + (7 * b + 3 * i) % (config.vocab_size - 4));
    }
    batch[b].behaviour_logprobs.assign(R, -3.0f);
    batch[b].advantage = b % 2 ? 1.0f : -0.5f;
  }
  TrainOptions options;
  options.learning_rate = 1e-2f;
  options.entropy_coef = 0.01;
  options.eps = 1e-3f;
  options.grad_clip = 0.25f;
  auto stats = (*policy)->TrainStep(batch, options);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->grad_norm, options.grad_clip) << "the clip is not exercised";
  ASSERT_TRUE((*policy)->SaveSafetensors(ours).ok());

  const std::string script = rlfleet::testing::RunfilePath("libs/model/reference/reference_train_step.py");
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", script, " ", before, " 32 2 4 32 ", B, " ", P, " ", R,
                   " 1 cpu fp32 check=", theirs, " lr=0.01 eps=0.001 clip=0.25 > ", dir, "/check.json");
  ASSERT_EQ(std::system(command.c_str()), 0) << "the PyTorch reference failed: " << command;
  auto start = ReadSafetensors(before), mine = ReadSafetensors(ours), reference = ReadSafetensors(theirs);
  ASSERT_TRUE(start.ok() && mine.ok() && reference.ok());
  float worst = 0, moved = 0;
  for (const auto& [name, blob] : *mine) {
    ASSERT_TRUE(reference->count(name)) << name;
    const std::string& r = reference->at(name).bytes;
    ASSERT_EQ(blob.bytes.size(), r.size()) << name;
    const float* a = reinterpret_cast<const float*>(blob.bytes.data());
    const float* t = reinterpret_cast<const float*>(r.data());
    const float* s0 = reinterpret_cast<const float*>(start->at(name).bytes.data());
    for (size_t i = 0; i < blob.bytes.size() / 4; ++i) {
      worst = std::max(worst, std::fabs(a[i] - t[i]));
      moved = std::max(moved, std::fabs(a[i] - s0[i]));
    }
  }
  EXPECT_EQ(mine->size(), reference->size());
  EXPECT_GT(moved, 1e-3f) << "the step hardly moved the weights";
  EXPECT_LT(worst, 1e-5f) << "max |ours - pytorch| over the weights after one step";
  std::cout << "after one step: weights moved up to " << moved << "; max abs difference vs PyTorch " << worst << "\n";
}

}  // namespace
}  // namespace rlfleet::model
