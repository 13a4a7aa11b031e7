// The C++ policy against a PyTorch reference of the same architecture reading the same
// safetensors file: logits agree to 1e-5 (fp32).
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

}  // namespace
}  // namespace rlfleet::model
