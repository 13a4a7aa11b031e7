// libtorch (Debian 1.13, CPU) links and computes, on OpenBLAS rather than the slow
// reference BLAS (DESIGN.md: several times slower; tools/setup.sh installs OpenBLAS).
#include <torch/torch.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace {

TEST(Torch, MatmulAndAutogradWork) {
  torch::manual_seed(0);
  auto a = torch::randn({64, 32});
  auto b = torch::randn({32, 16}, torch::requires_grad());
  auto c = torch::matmul(a, b).sum();
  c.backward();
  // d(sum(a @ b))/db[k][j] = sum_i a[i][k]
  auto expected = a.sum(0).unsqueeze(1).expand({32, 16});
  EXPECT_TRUE(torch::allclose(b.grad(), expected, 1e-4, 1e-5));
}

TEST(Torch, BlasIsOpenBlas) {
  std::ifstream maps("/proc/self/maps");
  std::string line, blas;
  while (std::getline(maps, line)) {
    if (line.find("libblas.so") != std::string::npos || line.find("openblas") != std::string::npos) {
      blas += line.substr(line.find('/')) + "\n";
    }
  }
  torch::mm(torch::ones({8, 8}), torch::ones({8, 8}));  // BLAS is loaded by now
  EXPECT_NE(blas.find("openblas"), std::string::npos)
      << "libtorch is not using OpenBLAS (run tools/setup.sh); mapped:\n" << blas;
}

}  // namespace
