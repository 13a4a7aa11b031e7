// Proves that each apt library wrapped by //third_party:system_libs.bzl compiles, links
// and works: hiredis against the redis-server that tools/test.sh starts, UCX by
// creating a worker, Gloo by a 2-rank all-reduce over loopback TCP, Google Benchmark by
// running a benchmark.
#include <hiredis/hiredis.h>
#include <ucp/api/ucp.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "gtest/gtest.h"
#include "tests/util/redis_for_test.h"

namespace {

TEST(Hiredis, PingsTheTestRedisServer) {
  absl::StatusOr<int> redis_port = rlfleet::testing::RedisPortForTest();
  ASSERT_TRUE(redis_port.ok()) << redis_port.status();
  const std::string port = std::to_string(*redis_port);
  redisContext* c = redisConnect("127.0.0.1", *redis_port);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->err, 0) << c->errstr;
  auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(std::string(reply->str, reply->len), "PONG");
  freeReplyObject(reply);
  redisFree(c);
}

TEST(Ucx, CreatesAContextAndWorker) {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  EXPECT_GE(major * 100 + minor, 113u);
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
  ucp_config_t* config = nullptr;
  ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
  ucp_context_h context = nullptr;
  ASSERT_EQ(ucp_init(&params, config, &context), UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wparams = {};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  ASSERT_EQ(ucp_worker_create(context, &wparams, &worker), UCS_OK);
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  ASSERT_EQ(ucp_worker_get_address(worker, &address, &address_length), UCS_OK);
  EXPECT_GT(address_length, 0u);
  ucp_worker_release_address(worker, address);
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
}

TEST(Gloo, TwoRankAllReduceOverLoopbackTcp) {
  gloo::rendezvous::HashStore store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  std::vector<std::vector<float>> data(2, std::vector<float>(1000));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, 2);
      context->setTimeout(std::chrono::seconds(30));
      context->connectFullMesh(store, device);
      for (size_t i = 0; i < data[rank].size(); ++i) data[rank][i] = float(i * (rank + 1));
      gloo::AllreduceOptions opts(context);
      opts.setOutput(data[rank].data(), data[rank].size());
      void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
      opts.setReduceFunction(sum);
      gloo::allreduce(opts);
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < data[rank].size(); ++i) ASSERT_EQ(data[rank][i], float(3 * i));
  }
}

int g_iterations = 0;
void BM_Add(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(state.iterations() + 1);
    ++g_iterations;
  }
}

TEST(Benchmark, RunsARegisteredBenchmark) {
  benchmark::RegisterBenchmark("BM_Add", BM_Add)->Iterations(100);
  int argc = 2;
  char arg0[] = "test", arg1[] = "--benchmark_min_time=0.001";
  char* argv[] = {arg0, arg1};
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  EXPECT_EQ(g_iterations, 100);
}

}  // namespace
