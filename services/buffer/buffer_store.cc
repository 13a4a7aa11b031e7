#include "services/buffer/buffer_store.h"

#include <deque>

#include "absl/synchronization/mutex.h"

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

  // Group commit (LevelDB's write queue): concurrent callers queue their batches; the
  // first in the queue writes every queued batch in one MULTI/EXEC round trip and
  // tells the others. A batch is still all or none (its group is).
  absl::Status Added(const std::vector<const v1::Experience*>& experiences) override {
    if (experiences.empty()) return absl::OkStatus();
    Writer w;
    w.hset.reserve(2 * experiences.size());
    for (const v1::Experience* e : experiences) {  // serialised outside every lock
      w.hset.push_back(e->experience_id().value());
      w.hset.push_back(e->SerializeAsString());
      w.bytes += w.hset.back().size();
    }
    queue_mu_.Lock();
    writers_.push_back(&w);
    auto leader_or_done = [&w, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
      return w.done || writers_.front() == &w;
    };
    queue_mu_.Await(absl::Condition(&leader_or_done));
    if (w.done) {
      queue_mu_.Unlock();
      return w.status;
    }
    std::vector<Writer*> group;
    uint64_t bytes = 0;
    for (Writer* x : writers_) {
      if (!group.empty() && bytes + x->bytes > kMaxGroupBytes) break;
      group.push_back(x);
      bytes += x->bytes;
    }
    queue_mu_.Unlock();
    std::vector<std::string> hset = {"HSET", prefix_ + "exp"};
    std::vector<std::string> sadd = {"SADD", prefix_ + "seen"};
    uint64_t count = 0;
    for (Writer* x : group) {
      for (size_t i = 0; i < x->hset.size(); i += 2) {
        sadd.push_back(x->hset[i]);
        hset.push_back(std::move(x->hset[i]));
        hset.push_back(std::move(x->hset[i + 1]));
        ++count;
      }
    }
    const absl::Status status =
        client_
            ->Pipeline({{"MULTI"}, hset, sadd,
                        {"HINCRBY", prefix_ + "counters", "accepted_total", absl::StrCat(count)},
                        {"EXEC"}})
            .status();
    queue_mu_.Lock();
    for (Writer* x : group) {
      x->status = status;
      x->done = true;
      writers_.pop_front();
    }
    queue_mu_.Unlock();
    return status;
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
  struct Writer {
    std::vector<std::string> hset;  // id, bytes, id, bytes, ...
    uint64_t bytes = 0;
    bool done = false;
    absl::Status status;
  };
  static constexpr uint64_t kMaxGroupBytes = 64 << 20;

  const std::unique_ptr<redis::Client> client_;
  const std::string prefix_;
  absl::Mutex queue_mu_;
  std::deque<Writer*> writers_ ABSL_GUARDED_BY(queue_mu_);
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
