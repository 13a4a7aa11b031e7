#include "services/buffer/buffer_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "libs/common/status_macros.h"
#include "libs/redis/redis_client.h"

namespace rlfleet::buffer {
namespace {

// Layout under the prefix: hash "exp" (id -> Experience bytes), set "seen", hash
// "counters". Writes go in MULTI/EXEC so a crash never leaves half a batch.
class RedisBufferStore : public BufferStore {
 public:
  RedisBufferStore(std::unique_ptr<redis::Client> client, std::string prefix)
      : client_(std::move(client)), prefix_(std::move(prefix)) {}

  absl::Status Added(const std::vector<const v1::Experience*>& experiences) override {
    if (experiences.empty()) return absl::OkStatus();
    std::vector<std::string> hset = {"HSET", prefix_ + "exp"};
    std::vector<std::string> sadd = {"SADD", prefix_ + "seen"};
    for (const v1::Experience* e : experiences) {
      hset.push_back(e->experience_id().value());
      hset.push_back(e->SerializeAsString());
      sadd.push_back(e->experience_id().value());
    }
    return client_
        ->Pipeline({{"MULTI"}, hset, sadd,
                    {"HINCRBY", prefix_ + "counters", "accepted_total", absl::StrCat(experiences.size())},
                    {"EXEC"}})
        .status();
  }

  absl::Status Removed(const std::vector<std::string>& ids, const std::string& counter) override {
    if (ids.empty()) return absl::OkStatus();
    std::vector<std::string> hdel = {"HDEL", prefix_ + "exp"};
    hdel.insert(hdel.end(), ids.begin(), ids.end());
    return client_
        ->Pipeline({{"MULTI"}, hdel, {"HINCRBY", prefix_ + "counters", counter, absl::StrCat(ids.size())},
                    {"EXEC"}})
        .status();
  }

  absl::Status Count(const std::string& counter, uint64_t n) override {
    if (n == 0) return absl::OkStatus();
    return client_->Command({"HINCRBY", prefix_ + "counters", counter, absl::StrCat(n)}).status();
  }

  absl::StatusOr<BufferSnapshot> Load() override {
    ASSIGN_OR_RETURN(std::vector<redis::Reply> r,
                     client_->Pipeline({{"HGETALL", prefix_ + "exp"},
                                        {"SMEMBERS", prefix_ + "seen"},
                                        {"HGETALL", prefix_ + "counters"}}));
    BufferSnapshot snapshot;
    for (size_t i = 0; i + 1 < r[0].elements.size(); i += 2) {
      v1::Experience e;
      if (!e.ParseFromString(r[0].elements[i + 1].str)) {
        return absl::DataLossError(absl::StrCat("stored experience ", r[0].elements[i].str, " is corrupt"));
      }
      snapshot.experiences.push_back(std::move(e));
    }
    for (const redis::Reply& id : r[1].elements) snapshot.seen_ids.push_back(id.str);
    for (size_t i = 0; i + 1 < r[2].elements.size(); i += 2) {
      uint64_t v = 0;
      (void)absl::SimpleAtoi(r[2].elements[i + 1].str, &v);
      snapshot.counters[r[2].elements[i].str] = v;
    }
    return snapshot;
  }

 private:
  const std::unique_ptr<redis::Client> client_;
  const std::string prefix_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BufferStore>> OpenBufferStore(absl::string_view connection) {
  if (connection.empty() || connection == "memory://") return std::unique_ptr<BufferStore>();
  if (!absl::StartsWith(connection, "redis://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown buffer store `", connection, "`: want memory:// or redis://host:port[/prefix]"));
  }
  ASSIGN_OR_RETURN(redis::Url url, redis::ParseUrl(connection, "rlfleet:buffer:"));
  ASSIGN_OR_RETURN(auto client, redis::Client::Connect(url.host, url.port));
  const std::string prefix = url.prefix;
  return std::unique_ptr<BufferStore>(new RedisBufferStore(std::move(client), prefix));
}

}  // namespace rlfleet::buffer
