// The Redis client against the redis-server that tools/test.sh starts
// (RLFLEET_REDIS_PORT): commands it encodes itself must arrive byte for byte, however
// large, however many pieces.
#include "libs/redis/redis_client.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/ids.h"

namespace rlfleet::redis {
namespace {

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* port = std::getenv("RLFLEET_REDIS_PORT");
    ASSERT_NE(port, nullptr) << "RLFLEET_REDIS_PORT unset: run through tools/test.sh";
    auto client = Client::Connect("127.0.0.1", std::atoi(port));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    prefix_ = common::NewId("redis-client-test") + ":";
  }
  std::unique_ptr<Client> client_;
  std::string prefix_;
};

// Values of every size around the inline threshold and far above it, with CR, LF and
// NUL inside, come back exactly.
TEST_F(RedisClientTest, ValuesRoundTripByteForByte) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4096}, size_t{9} << 20}) {
    std::string value(size, '\0');
    for (size_t i = 0; i < size; ++i) value[i] = "\r\n\0x$*"[i % 6];
    const std::string key = absl::StrCat(prefix_, "v", size);
    auto set = client_->PipelineViews({{"SET", key, value}, {"GET", key}});
    ASSERT_TRUE(set.ok()) << set.status();
    ASSERT_EQ((*set)[1].type, Reply::Type::kString);
    EXPECT_EQ((*set)[1].str, value) << "size " << size;
  }
}

// More pieces than one sendmsg takes (1024): a 3000-argument command and a pipeline of
// 1500 commands arrive whole and in order.
TEST_F(RedisClientTest, ManyPiecesArriveInOrder) {
  std::vector<std::string> values;
  for (int i = 0; i < 3000; ++i) values.push_back(std::string(70 + i % 50, static_cast<char>('a' + i % 26)) + std::to_string(i));
  const std::string list = prefix_ + "list";
  std::vector<absl::string_view> rpush = {"RPUSH", list};
  rpush.insert(rpush.end(), values.begin(), values.end());
  auto pushed = client_->PipelineViews({rpush});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ((*pushed)[0].integer, 3000);
  auto range = client_->Command({"LRANGE", list, "0", "-1"});
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->elements.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(range->elements[i].str, values[i]) << i;

  std::vector<std::vector<std::string>> incrs;
  for (int i = 0; i < 1500; ++i) incrs.push_back({"INCR", prefix_ + "counter"});
  auto counted = client_->Pipeline(incrs);
  ASSERT_TRUE(counted.ok()) << counted.status();
  ASSERT_EQ(counted->size(), 1500u);
  for (int i = 0; i < 1500; ++i) ASSERT_EQ((*counted)[i].integer, i + 1);
}

TEST_F(RedisClientTest, AnErrorReplyIsInternalWithRedisMessage) {
  auto r = client_->Command({"NOSUCHCOMMAND", "x"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("unknown command"), absl::string_view::npos) << r.status();
  // The connection is still usable afterwards.
  auto ping = client_->Command({"PING"});
  ASSERT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(ping->str, "PONG");
}

}  // namespace
}  // namespace rlfleet::redis
