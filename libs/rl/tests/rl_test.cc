// Each estimator and the PPO loss against values worked out by hand, with the edge
// cases: all-equal groups, one-sample groups, a single-token response, fully masked rows.
#include "libs/rl/rl.h"

#include <cmath>

#include "gtest/gtest.h"

namespace rlfleet::rl {
namespace {

float At(const torch::Tensor& t, int64_t i, int64_t j) { return t.index({i, j}).item<float>(); }

TEST(Advantages, GrpoNormalisesWithinEachGroup) {
  torch::Tensor r = torch::tensor({{1.0f, 0.0f, 0.0f, 1.0f}, {0.5f, 0.5f, 0.5f, 0.5f}});
  torch::Tensor a = GrpoAdvantages(r);
  // Group 0: mean 0.5, population std 0.5 -> +-1.
  EXPECT_NEAR(At(a, 0, 0), 1.0f, 1e-5);
  EXPECT_NEAR(At(a, 0, 1), -1.0f, 1e-5);
  // Group 1: all equal -> zero advantages, not NaN.
  for (int j = 0; j < 4; ++j) EXPECT_EQ(At(a, 1, j), 0.0f);
  torch::Tensor centered = GrpoAdvantages(r, /*scale_by_std=*/false);
  EXPECT_NEAR(At(centered, 0, 0), 0.5f, 1e-6);
}

TEST(Advantages, RlooSubtractsTheMeanOfTheOthers) {
  torch::Tensor r = torch::tensor({{1.0f, 0.0f, 0.5f}});
  torch::Tensor a = RlooAdvantages(r);
  EXPECT_NEAR(At(a, 0, 0), 1.0f - 0.25f, 1e-6);                        // others: 0, 0.5
  EXPECT_NEAR(At(a, 0, 1), 0.0f - 0.75f, 1e-6);                        // others: 1, 0.5
  EXPECT_NEAR(At(a, 0, 2), 0.5f - 0.5f, 1e-6);                         // others: 1, 0
  EXPECT_EQ(At(RlooAdvantages(torch::tensor({{3.0f}})), 0, 0), 0.0f);  // K = 1
}

TEST(Advantages, GaeMatchesAHandRecursion) {
  // One row, 3 real tokens then padding; reward 1 on the last real token.
  torch::Tensor rewards = torch::tensor({{0.0f, 0.0f, 1.0f, 0.0f}});
  torch::Tensor values = torch::tensor({{0.5f, 0.6f, 0.7f, 9.0f}});
  torch::Tensor mask = torch::tensor({{1.0f, 1.0f, 1.0f, 0.0f}});
  const double g = 0.9, l = 0.8;
  GaeResult r = Gae(rewards, values, mask, g, l);
  const double d2 = 1.0 - 0.7;  // last token: no bootstrap from padding
  const double d1 = 0.0 + g * 0.7 - 0.6;
  const double d0 = 0.0 + g * 0.6 - 0.5;
  const double a2 = d2, a1 = d1 + g * l * a2, a0 = d0 + g * l * a1;
  EXPECT_NEAR(At(r.advantages, 0, 2), a2, 1e-5);
  EXPECT_NEAR(At(r.advantages, 0, 1), a1, 1e-5);
  EXPECT_NEAR(At(r.advantages, 0, 0), a0, 1e-5);
  EXPECT_EQ(At(r.advantages, 0, 3), 0.0f);
  EXPECT_NEAR(At(r.returns, 0, 0), a0 + 0.5, 1e-5);
}

TEST(PpoLoss, ClipsTheRatioAndReportsTheClipFraction) {
  // Two tokens: ratio e^0.5 (clipped for a positive advantage) and e^-0.05 (inside).
  torch::Tensor old_lp = torch::tensor({{-1.0f, -1.0f}});
  torch::Tensor new_lp = torch::tensor({{-0.5f, -1.05f}}, torch::requires_grad());
  torch::Tensor adv = torch::tensor({2.0f});
  torch::Tensor mask = torch::ones({1, 2});
  PpoLoss l = PpoPolicyLoss(new_lp, old_lp, adv, mask, PpoOptions{0.2, 0, 0, 0});
  const double t0 = -std::min(std::exp(0.5) * 2.0, 1.2 * 2.0);
  const double t1 = -std::min(std::exp(-0.05) * 2.0, std::max(std::exp(-0.05), 0.8) * 2.0);
  EXPECT_NEAR(l.policy_loss.item<float>(), (t0 + t1) / 2, 1e-5);
  EXPECT_NEAR(l.clip_fraction.item<float>(), 0.5f, 1e-6);
  l.loss.backward();
  // The clipped token passes no gradient.
  EXPECT_EQ(new_lp.grad().index({0, 0}).item<float>(), 0.0f);
  EXPECT_NE(new_lp.grad().index({0, 1}).item<float>(), 0.0f);
}

TEST(PpoLoss, ClipHighMakesTheClipAsymmetric) {
  // Ratio e^0.3 (~1.35) with a positive advantage: clipped at 1.2 by a symmetric 0.2,
  // inside [0.8, 1.5] with clip_high 0.5; ratio e^-0.3 (~0.74) is still clipped below.
  torch::Tensor old_lp = torch::tensor({{-1.0f, -1.0f}});
  torch::Tensor new_lp = torch::tensor({{-0.7f, -1.3f}}, torch::requires_grad());
  torch::Tensor adv = torch::tensor({1.0f});
  torch::Tensor mask = torch::ones({1, 2});
  PpoOptions symmetric{0.2, 0, 0, 0};
  PpoOptions high = symmetric;
  high.clip_high = 0.5;
  PpoLoss s = PpoPolicyLoss(new_lp, old_lp, adv, mask, symmetric);
  PpoLoss h = PpoPolicyLoss(new_lp, old_lp, adv, mask, high);
  const double low_token = -std::min(std::exp(-0.3), 0.8);
  EXPECT_NEAR(s.policy_loss.item<float>(), (-1.2 + low_token) / 2, 1e-5);
  EXPECT_NEAR(h.policy_loss.item<float>(), (-std::exp(0.3) + low_token) / 2, 1e-5);
  EXPECT_NEAR(s.clip_fraction.item<float>(), 0.5f, 1e-6);
  h.loss.backward();
  EXPECT_NE(new_lp.grad().index({0, 0}).item<float>(), 0.0f);  // the high token now passes gradient
}

TEST(PpoLoss, MasksSingleTokensAndEmptyBatches) {
  torch::Tensor lp = torch::tensor({{-0.7f, -3.0f}, {-9.0f, -9.0f}});
  torch::Tensor mask = torch::tensor({{1.0f, 0.0f}, {0.0f, 0.0f}});  // one real token in total
  PpoLoss l = PpoPolicyLoss(lp, lp, torch::tensor({1.5f, 4.0f}), mask);
  EXPECT_NEAR(l.policy_loss.item<float>(), -1.5f, 1e-6);  // ratio 1 on the only token
  PpoLoss none = PpoPolicyLoss(lp, lp, torch::tensor({1.0f, 1.0f}), torch::zeros({2, 2}));
  EXPECT_EQ(none.loss.item<float>(), 0.0f);
  EXPECT_FALSE(std::isnan(none.clip_fraction.item<float>()));
}

TEST(PpoLoss, KlPenaltyEntropyBonusAndTruncatedImportanceWeights) {
  torch::Tensor new_lp = torch::tensor({{-1.0f}});
  torch::Tensor ref = torch::tensor({{-1.5f}});
  torch::Tensor ent = torch::tensor({{0.3f}});
  torch::Tensor mask = torch::ones({1, 1});
  PpoOptions o;
  o.kl_coef = 0.1;
  o.entropy_coef = 0.01;
  PpoLoss l = PpoPolicyLoss(new_lp, new_lp, torch::tensor({1.0f}), mask, o, {}, ref, ent);
  const double d = -0.5;
  EXPECT_NEAR(l.kl.item<float>(), std::exp(d) - d - 1, 1e-6);
  EXPECT_NEAR(l.loss.item<float>(), -1.0 + 0.1 * (std::exp(d) - d - 1) - 0.01 * 0.3, 1e-6);
  // A stale token (behaviour much less likely than old) is weighted by the cap, 2.
  torch::Tensor behaviour = torch::tensor({{-5.0f}});
  PpoLoss w = PpoPolicyLoss(new_lp, new_lp, torch::tensor({1.0f}), mask, PpoOptions{}, behaviour);
  EXPECT_NEAR(w.policy_loss.item<float>(), -2.0f, 1e-6);
}

}  // namespace
}  // namespace rlfleet::rl
