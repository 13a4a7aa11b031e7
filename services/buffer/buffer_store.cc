#include "services/buffer/buffer_store.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/await_callback.h"
#include "libs/common/status_macros.h"
#include "libs/redis/redis_client.h"
#include "services/buffer/experience_reader.h"
#include "services/buffer/varint.h"

namespace rlfleet::buffer {
namespace {

// Records are length-prefixed (a varint32, then the bytes).
void PutRecord(std::string* out, absl::string_view bytes) {
  PutVarint32(out, static_cast<uint32_t>(bytes.size()));
  out->append(bytes.data(), bytes.size());
}

// The next record of `*in` into `*record`; false at the end or on a malformed record
// (`*bad` then true).
bool GetRecord(absl::string_view* in, absl::string_view* record, bool* bad) {
  if (in->empty()) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(in->data());
  const uint8_t* const end = p + in->size();
  uint64_t n = 0;
  if (!ReadVarint(&p, end, &n) || n > static_cast<uint64_t>(end - p)) {
    *bad = true;
    return false;
  }
  const size_t header = p - reinterpret_cast<const uint8_t*>(in->data());
  *record = in->substr(header, n);
  in->remove_prefix(header + n);
  return true;
}

// Layout under the prefix (README "Buffer durability"):
//   seg:<n>       string: the records (serialized Experiences) of one group commit
//   gone:<n>      string: records (reason byte + id) of segment n's experiences since
//                 removed; kept after the segment is retired, as the record of its ids
//   segs          set: the live segment numbers
//   done          set: retired segment numbers (every experience removed; seg:<n> deleted)
//   counters      hash: dropped_duplicate, dropped_rejected (informational)
//   config        string: the last ConfigureRequest applied
//   policy_version  sorted set: member "policy" scored with the highest policy version
//   next_segment  integer: segment numbers are reserved from it in blocks
// A commit is a handful of commands whatever its size (Redis appends bytes, no
// per-experience hash entry), in one MULTI/EXEC so a crash never leaves half a batch.
// The accounting is derived, not counted: accepted = distinct ids in the segments and
// gone logs, consumed / dropped = distinct ids in the gone logs by reason. So a write
// whose reply was lost (Redis died after committing it) and was then retried leaves a
// repeated record, which Load reads once, and never a count that is off.
class RedisBufferStore : public BufferStore {
 public:
  RedisBufferStore(std::unique_ptr<redis::Client> client, std::string prefix, size_t keep_retired)
      : client_(std::move(client)), prefix_(std::move(prefix)), keep_retired_(std::max<size_t>(1, keep_retired)) {}

  ~RedisBufferStore() override {
    {
      absl::MutexLock lock(&queue_mu_);
      stopping_ = true;
    }
    if (committer_.joinable()) committer_.join();  // (after committing what was queued)
  }

  absl::StatusOr<uint64_t> Added(const std::vector<ExperienceBytes>& experiences) override {
    // (the Redis client's timeout bounds the wait)
    return common::AwaitCallback<absl::StatusOr<uint64_t>>(
        [&](auto done) { AddedAsync(experiences, std::move(done)); });
  }

  // Group commit (LevelDB's write queue, on a thread of its own): callers queue their
  // batches and return; the committer writes everything queued in one MULTI/EXEC round
  // trip while the next batches queue behind it, then tells each caller. A batch is
  // still all or none (its group is). No caller's thread waits for Redis.
  void AddedAsync(const std::vector<ExperienceBytes>& experiences,
                  std::function<void(absl::StatusOr<uint64_t>)> done) override {
    if (experiences.empty()) return done(0);
    auto w = std::make_unique<Writer>();
    w->count = static_cast<uint32_t>(experiences.size());
    w->done = std::move(done);
    size_t total = 0;
    for (const ExperienceBytes& e : experiences) total += e.bytes.size() + 5;
    w->records.reserve(total);
    for (const ExperienceBytes& e : experiences) {  // framed outside every lock
      PutRecord(&w->records, e.bytes);
      w->newest_version = std::max(w->newest_version, e.newest_version);
    }
    {
      absl::MutexLock lock(&queue_mu_);
      if (!stopping_) {
        writers_.push_back(std::move(w));
        if (!committer_.joinable()) committer_ = std::thread([this] { CommitLoop(); });
        return;
      }
    }
    w->done(absl::UnavailableError("buffer store is closing"));
  }

  absl::Status Removed(const std::vector<StoredRef>& refs, const std::string& counter) override {
    if (refs.empty()) return absl::OkStatus();
    const char reason = ReasonCode(counter);
    if (reason == 0) return absl::InvalidArgumentError(absl::StrCat("unknown removal counter `", counter, "`"));
    absl::MutexLock lock(&mu_);            // (removals are rare: one round trip under the lock)
    std::map<uint64_t, std::string> gone;  // segment -> records
    std::map<uint64_t, uint32_t> removing;
    for (const StoredRef& r : refs) {
      PutRecord(&gone[r.segment], absl::StrCat(absl::string_view(&reason, 1), r.id));
      ++removing[r.segment];
    }
    std::vector<std::string> keys;  // (the views below point into these)
    keys.reserve(3 * gone.size());
    std::vector<std::vector<absl::string_view>> commands = {{"MULTI"}};
    std::vector<std::pair<uint64_t, uint32_t>> next_live;
    for (const auto& [segment, records] : gone) {
      auto it = live_.find(segment);
      const uint32_t live = it == live_.end() ? 0 : it->second;
      const uint32_t left = live > removing[segment] ? live - removing[segment] : 0;
      next_live.emplace_back(segment, left);
      keys.push_back(GoneKey(segment));
      commands.push_back({"APPEND", keys.back(), records});
      if (left == 0) {  // retired: its bytes go, its gone log stays
        keys.push_back(SegmentKey(segment));
        keys.push_back(absl::StrCat(segment));
        commands.push_back({"DEL", keys[keys.size() - 2]});
        commands.push_back({"SREM", segs_key_, keys.back()});
        commands.push_back({"SADD", done_key_, keys.back()});
      }
    }
    commands.push_back({"EXEC"});
    RETURN_IF_ERROR(client_->PipelineViews(commands).status());
    for (const auto& [segment, left] : next_live) {
      if (left == 0) {
        live_.erase(segment);
        done_.insert(segment);
      } else {
        live_[segment] = left;
      }
    }
    if (done_.size() > keep_retired_ + keep_retired_ / 4) {
      // (best effort: what is not compacted now is next time, or by the next Load)
      (void)CompactLocked();
    }
    return absl::OkStatus();
  }

  absl::Status SavePolicyVersion(uint64_t version) override {
    // (ZADD GT: only ever raised, whichever write lands last)
    return client_->Command({"ZADD", version_key_, "GT", absl::StrCat(version), "policy"}).status();
  }

  absl::Status SaveConfig(const v1::ConfigureRequest& config) override {
    return client_->Command({"SET", prefix_ + "config", config.SerializeAsString()}).status();
  }

  absl::Status Count(const std::string& counter, uint64_t n) override {
    if (n == 0) return absl::OkStatus();
    return client_->Command({"HINCRBY", counters_key_, counter, absl::StrCat(n)}).status();
  }

  absl::StatusOr<BufferSnapshot> Load() override {
    ASSIGN_OR_RETURN(std::vector<redis::Reply> r, client_->Pipeline({{"EXISTS", prefix_ + "exp"},
                                                                     {"SMEMBERS", segs_key_},
                                                                     {"SMEMBERS", done_key_},
                                                                     {"HGETALL", counters_key_},
                                                                     {"GET", prefix_ + "config"},
                                                                     {"ZSCORE", version_key_, "policy"}}));
    if (r[0].integer != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the store under `", prefix_, "` holds experiences in the layout before segments (hash `",
                       prefix_, "exp`): drain them with the rlfleet-buffer that wrote them, or use a new prefix"));
    }
    // A record that does not read is skipped and named in snapshot.skipped: one bad
    // record must not keep the buffer from starting (what it held is lost either way).
    BufferSnapshot snapshot;
    auto skip = [&snapshot](std::string what) { snapshot.skipped.push_back(std::move(what)); };
    if (!r[4].is_nil()) {
      v1::ConfigureRequest config;
      if (config.ParseFromString(r[4].str)) {
        snapshot.config = std::move(config);
      } else {
        skip(absl::StrCat("`", prefix_, "config` is not a ConfigureRequest (the defaults apply)"));
      }
    }
    if (!r[5].is_nil()) {
      double version = 0;
      // (a double holds every integer up to 2^53 exactly; beyond, it is no version we wrote)
      if (absl::SimpleAtod(r[5].str, &version) && version >= 0 && version <= 9007199254740992.0 &&
          version == std::floor(version)) {
        snapshot.policy_version = static_cast<uint64_t>(version);
      } else {
        skip(absl::StrCat("`", version_key_, "` holds `", r[5].str.substr(0, 64), "`, not a policy version"));
      }
    }
    for (size_t i = 0; i + 1 < r[3].elements.size(); i += 2) {
      uint64_t v = 0;
      if (absl::SimpleAtoi(r[3].elements[i + 1].str, &v)) {
        snapshot.counters[r[3].elements[i].str] = v;
      } else {
        skip(absl::StrCat("`", counters_key_, "` field `", r[3].elements[i].str.substr(0, 64), "` is not a count"));
      }
    }
    const std::vector<uint64_t> live = Numbers(r[1], segs_key_, &snapshot.skipped);
    const std::vector<uint64_t> done = Numbers(r[2], done_key_, &snapshot.skipped);
    std::vector<std::vector<std::string>> gets;
    for (uint64_t n : live) {
      gets.push_back({"GET", SegmentKey(n)});
      gets.push_back({"GET", GoneKey(n)});
    }
    for (uint64_t n : done) gets.push_back({"GET", GoneKey(n)});
    ASSIGN_OR_RETURN(std::vector<redis::Reply> data, client_->Pipeline(gets));
    // Every removal, by id (the first record of an id counts).
    absl::flat_hash_map<std::string, char> removed;
    for (size_t s = 0; s < live.size(); ++s) ReadGoneLog(data[2 * s + 1].str, live[s], &removed, &snapshot.skipped);
    for (size_t d = 0; d < done.size(); ++d) {
      ReadGoneLog(data[2 * live.size() + d].str, done[d], &removed, &snapshot.skipped);
    }
    absl::flat_hash_set<std::string> seen;
    for (const auto& [id, reason] : removed) seen.insert(id);
    for (const auto& [id, reason] : removed) ++snapshot.counters[ReasonCounter(reason)];
    absl::MutexLock lock(&mu_);
    live_.clear();
    std::vector<uint64_t> empty;  // live segments with nothing left in them
    ExperienceReader reader;      // (for the ids)
    ExperienceFacts facts;
    for (size_t s = 0; s < live.size(); ++s) {
      absl::string_view records = data[2 * s].str;
      absl::string_view record;
      bool bad = false;
      uint32_t count = 0;
      for (int index = 0; GetRecord(&records, &record, &bad); ++index) {
        reader.Read(record, &facts);
        if (!facts.parsed) {
          skip(absl::StrCat("`", SegmentKey(live[s]), "` record ", index, " is not a serialized Experience"));
          continue;
        }
        // Taken once: not removed, and not a second copy of an id (a commit whose reply
        // was lost, retried into a later segment).
        if (!seen.insert(facts.id).second) continue;
        snapshot.experiences.push_back({live[s], std::string(record)});
        ++count;
      }
      if (bad) {
        skip(absl::StrCat("`", SegmentKey(live[s]), "` is cut or garbled after its valid records (the rest skipped)"));
      }
      if (count > 0) {
        live_[live[s]] = count;
      } else {
        empty.push_back(live[s]);
      }
    }
    // (+= : the hash holds the counts of compacted segments)
    snapshot.counters["accepted_total"] += seen.size();
    snapshot.seen_ids.assign(seen.begin(), seen.end());
    for (uint64_t n : empty) {  // retire them (best effort: they are empty either way)
      (void)client_->Pipeline({{"MULTI"},
                               {"DEL", SegmentKey(n)},
                               {"SREM", segs_key_, absl::StrCat(n)},
                               {"SADD", done_key_, absl::StrCat(n)},
                               {"EXEC"}});
    }
    done_.clear();
    done_.insert(done.begin(), done.end());
    done_.insert(empty.begin(), empty.end());
    return snapshot;
  }

 private:
  struct Writer {
    std::string records;  // the experiences, length-prefixed
    uint32_t count = 0;
    uint64_t newest_version = 0;
    std::function<void(absl::StatusOr<uint64_t>)> done;
  };
  static constexpr uint64_t kMaxGroupBytes = 64 << 20;
  static constexpr uint64_t kSegmentBlock = 1024;

  std::string SegmentKey(uint64_t n) const { return absl::StrCat(prefix_, "seg:", n); }

  // Removal reasons as one byte in the gone logs, and back (0 / nullptr: unknown).
  static char ReasonCode(absl::string_view counter) {
    if (counter == "consumed_total") return 'c';
    if (counter == "dropped_stale") return 's';
    if (counter == "dropped_zero_variance") return 'z';
    return 0;
  }
  static const char* ReasonCounter(char code) {
    switch (code) {
      case 'c':
        return "consumed_total";
      case 's':
        return "dropped_stale";
      case 'z':
        return "dropped_zero_variance";
      default:
        return nullptr;
    }
  }
  // The segment numbers in `members`; a member that is not one is named in `*skipped`.
  std::vector<uint64_t> Numbers(const redis::Reply& members, const std::string& key,
                                std::vector<std::string>* skipped) const {
    std::vector<uint64_t> numbers;
    for (const redis::Reply& m : members.elements) {
      uint64_t n = 0;
      if (!absl::SimpleAtoi(m.str, &n)) {
        skipped->push_back(absl::StrCat("`", key, "` holds `", m.str.substr(0, 64), "`, not a segment number"));
        continue;
      }
      numbers.push_back(n);
    }
    std::sort(numbers.begin(), numbers.end());  // (recovered in the order they came)
    return numbers;
  }
  std::string GoneKey(uint64_t n) const { return absl::StrCat(prefix_, "gone:", n); }

  // Adds the removals recorded in segment n's gone log to *removed (id -> reason; the
  // first record of an id counts). A record with no known reason, or a log cut after
  // its valid records, is named in *skipped (when given) and left out.
  void ReadGoneLog(absl::string_view log, uint64_t n, absl::flat_hash_map<std::string, char>* removed,
                   std::vector<std::string>* skipped) const {
    absl::string_view record;
    bool bad = false;
    for (int index = 0; GetRecord(&log, &record, &bad); ++index) {
      if (record.empty() || ReasonCounter(record[0]) == nullptr) {
        if (skipped != nullptr)
          skipped->push_back(absl::StrCat("`", GoneKey(n), "` record ", index, " has no known reason"));
        continue;
      }
      removed->emplace(record.substr(1), record[0]);
    }
    if (bad && skipped != nullptr) {
      skipped->push_back(
          absl::StrCat("`", GoneKey(n), "` is cut or garbled after its valid records (the rest skipped)"));
    }
  }

  // Folds the gone logs of the oldest retired segments, all but the newest
  // keep_retired_, into the counters hash (accepted_total and a count per reason) and
  // deletes them, in one MULTI/EXEC. Without this the logs (and the ids a restarted
  // buffer reloads) grew for ever: a 30-minute soak took Redis from 35 to 260 MiB. Ids
  // of compacted segments are no longer refused as duplicates after a restart (their
  // run is long gone by then: ids carry a tag new to each run).
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (done_.size() <= keep_retired_) return absl::OkStatus();
    std::vector<uint64_t> oldest;
    for (auto it = done_.begin(); oldest.size() < done_.size() - keep_retired_; ++it) oldest.push_back(*it);
    std::vector<std::vector<std::string>> gets;
    for (uint64_t n : oldest) gets.push_back({"GET", GoneKey(n)});
    ASSIGN_OR_RETURN(std::vector<redis::Reply> logs, client_->Pipeline(gets));
    absl::flat_hash_map<std::string, char> removed;  // (an id counts once, as in Load)
    for (size_t i = 0; i < logs.size(); ++i) ReadGoneLog(logs[i].str, oldest[i], &removed, nullptr);
    std::map<std::string, uint64_t> counts;
    for (const auto& [id, reason] : removed) ++counts[ReasonCounter(reason)];
    counts["accepted_total"] = removed.size();
    std::vector<std::vector<std::string>> commands = {{"MULTI"}};
    for (const auto& [counter, n] : counts) commands.push_back({"HINCRBY", counters_key_, counter, absl::StrCat(n)});
    for (uint64_t n : oldest) {
      commands.push_back({"DEL", GoneKey(n)});
      commands.push_back({"SREM", done_key_, absl::StrCat(n)});
    }
    commands.push_back({"EXEC"});
    RETURN_IF_ERROR(client_->Pipeline(commands).status());
    for (uint64_t n : oldest) done_.erase(n);
    return absl::OkStatus();
  }

  // The committer: takes what is queued (up to kMaxGroupBytes), commits it, answers.
  void CommitLoop() {
    for (;;) {
      std::vector<std::unique_ptr<Writer>> group;
      {
        absl::MutexLock lock(&queue_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return stopping_ || !writers_.empty(); };
        queue_mu_.Await(absl::Condition(&ready));
        if (writers_.empty()) return;  // stopping, and everything queued was committed
        uint64_t bytes = 0;
        while (!writers_.empty() && (group.empty() || bytes + writers_.front()->records.size() <= kMaxGroupBytes)) {
          bytes += writers_.front()->records.size();
          group.push_back(std::move(writers_.front()));
          writers_.pop_front();
        }
      }
      const absl::StatusOr<uint64_t> segment = Commit(group);
      for (const auto& w : group) w->done(segment);
    }
  }

  // Writes one group's batches as a new segment. Called by the committer only.
  absl::StatusOr<uint64_t> Commit(const std::vector<std::unique_ptr<Writer>>& group) {
    uint64_t segment = 0;
    {
      absl::MutexLock lock(&mu_);
      if (next_segment_ == segment_limit_) {
        // A block of numbers no other incarnation of this buffer has used.
        ASSIGN_OR_RETURN(redis::Reply top,
                         client_->Command({"INCRBY", prefix_ + "next_segment", absl::StrCat(kSegmentBlock)}));
        segment_limit_ = static_cast<uint64_t>(top.integer) + 1;
        next_segment_ = segment_limit_ - kSegmentBlock;
      }
      segment = next_segment_++;
    }
    const std::string key = SegmentKey(segment), number = absl::StrCat(segment);
    uint32_t count = 0;
    uint64_t newest = 0;
    std::vector<std::vector<absl::string_view>> commands = {{"MULTI"}};
    for (const auto& x : group) {
      commands.push_back({"APPEND", key, x->records});
      count += x->count;
      newest = std::max(newest, x->newest_version);
    }
    commands.push_back({"SADD", segs_key_, number});
    const std::string version = absl::StrCat(newest);
    if (newest > 0) commands.push_back({"ZADD", version_key_, "GT", version, "policy"});
    commands.push_back({"EXEC"});
    RETURN_IF_ERROR(client_->PipelineViews(commands).status());
    absl::MutexLock lock(&mu_);
    live_[segment] = count;
    return segment;
  }

  const std::unique_ptr<redis::Client> client_;
  const std::string prefix_;
  const std::string segs_key_ = prefix_ + "segs";
  const std::string done_key_ = prefix_ + "done";
  const std::string version_key_ = prefix_ + "policy_version";
  const std::string counters_key_ = prefix_ + "counters";
  absl::Mutex queue_mu_;
  std::deque<std::unique_ptr<Writer>> writers_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread committer_;  // started under queue_mu_; joined by the destructor after stopping_
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, uint32_t> live_ ABSL_GUARDED_BY(mu_);  // segment -> experiences not removed
  std::set<uint64_t> done_ ABSL_GUARDED_BY(mu_);                       // retired segments whose gone logs are kept
  const size_t keep_retired_;
  uint64_t next_segment_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t segment_limit_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BufferStore>> OpenBufferStore(absl::string_view connection, size_t keep_retired) {
  if (connection.empty() || connection == "memory://") return std::unique_ptr<BufferStore>();
  if (!absl::StartsWith(connection, "redis://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown buffer store `", connection, "`: want memory:// or redis://host:port[/prefix]"));
  }
  ASSIGN_OR_RETURN(redis::Url url, redis::ParseUrl(connection, "rlfleet:buffer:"));
  ASSIGN_OR_RETURN(auto client, redis::Client::Connect(url.host, url.port));
  return std::unique_ptr<BufferStore>(new RedisBufferStore(std::move(client), url.prefix, keep_retired));
}

}  // namespace rlfleet::buffer
