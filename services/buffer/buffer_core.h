// BufferCore: the experience buffer without gRPC. It takes scored experiences exactly
// once (by experience id: an id held, or among the newest SetRememberedRemovedIds
// consumed or dropped, is a duplicate), assembles GRPO groups of `group_size`, enforces the
// staleness bound (max policy-version lag) on the way in and on the way out, drops
// zero-variance groups when asked, applies byte-capacity backpressure (a Put that
// does not fit is RESOURCE_EXHAUSTED and nothing of it is taken, so nothing accepted
// is lost), and leases sampled groups until they are acked, nacked or the lease
// expires (then they return to the buffer). Every drop is counted by reason.
//
// With a BufferStore (buffer_store.h), every accepted experience is stored before the
// Put is answered and removed once consumed or dropped, and Recover() rebuilds the
// buffer after a restart. Thread-safe; SampleBatch may block up to its wait_ms for
// enough complete groups.
#ifndef RLFLEET_SERVICES_BUFFER_BUFFER_CORE_H_
#define RLFLEET_SERVICES_BUFFER_BUFFER_CORE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/clock.h"
#include "libs/transport/descriptor_fetcher.h"
#include "rlfleet/v1/buffer.pb.h"
#include "services/buffer/buffer_store.h"
#include "services/buffer/experience_reader.h"

namespace rlfleet::buffer {

inline constexpr int kMaxExperiencesPerPut = 1024;
inline constexpr int kMaxGroupsPerSample = 1024;
inline constexpr uint64_t kMinCapacityBytes = 1 << 20;
inline constexpr uint64_t kMaxCapacityBytes = uint64_t{1} << 40;
inline constexpr int64_t kMaxWaitMs = 600000;
inline constexpr int64_t kMinLeaseTtlMs = 1000;
inline constexpr int64_t kMaxLeaseTtlMs = 600000;
// A SampleBatch reply stays under this (gRPC's default receive limit, buffer.proto's
// contract); a group that could never fit in one is refused at Put.
inline constexpr uint64_t kMaxReplyBytes = 4 << 20;
// Policy versions: none above kMaxPolicyVersion; and once the buffer knows a version
// (from SampleBatch, the experiences it took or its store), an experience or a
// SampleBatch more than kMaxVersionLead ahead of it is refused, so that one caller
// cannot move the version every staleness check is measured against to an absurd value.
inline constexpr uint64_t kMaxPolicyVersion = uint64_t{1} << 48;
inline constexpr uint64_t kMaxVersionLead = 16;

class BufferCore {
 public:
  // `clock` and `store` are not owned; `store` may be null (state in memory only).
  // Waits in SampleBatch use real time bounded by wait_ms.
  explicit BufferCore(common::Clock* clock = common::Clock::Real(), BufferStore* store = nullptr);

  // Reloads what the store holds (call once, before serving): the last configuration,
  // then the experiences into their groups; ids seen before stay duplicates. No-op
  // without a store. A stored record that does not load (garbled, not a valid
  // experience, a group too large for a reply) is left out, one line naming its key
  // added to `*skipped` (if given); errors are the store's only (UNAVAILABLE).
  absl::Status Recover(std::vector<std::string>* skipped = nullptr);

  // INVALID_ARGUMENT naming the field for group_size outside 1..1024, capacity_bytes
  // outside 1 MiB..1 TiB (0: the default), zero_variance_epsilon not finite or negative,
  // default_lease_ttl_ms outside 1000..600000 (0: the default). Changing group_size
  // while experiences are held is FAILED_PRECONDITION.
  // With a store the configuration is recorded first (UNAVAILABLE if it cannot be).
  absl::Status Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response);

  // INVALID_ARGUMENT for an empty or oversized batch; FAILED_PRECONDITION for a run_id
  // that is not the configured run's;
  // RESOURCE_EXHAUSTED (nothing taken) when the acceptable experiences do not fit in
  // the capacity; UNAVAILABLE (nothing taken) when the store cannot record them. Per-experience problems are rejections
  // in the response, not errors. Experiences with a remote_payload are fetched through the payload fetcher first; one
  // that cannot be fetched (or is not the experience it claims) is rejected as REJECT_REASON_INVALID with a message
  // starting "remote_payload: ". The request in wire form (each experience still serialized: what the stream reads):
  // the buffer parses each to check it and keeps the bytes it was sent. The accepted experiences' bytes are moved out
  // of `*request`; on an error nothing is taken and `*request` still holds every experience (remote payloads may have
  // been replaced by the bytes fetched), so it can be retried.
  absl::Status Put(v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response);
  // Put without waiting for the store: `done` runs once with Put's status (`*response`
  // filled), on this thread or the store's; it must not block. `request` and
  // `response` must stay alive until then. The gRPC handlers' path: no thread of
  // theirs waits for Redis.
  void PutAsync(v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response,
                std::function<void(absl::Status)> done);
  // The same for a typed request (serialized first).
  absl::Status Put(const v1::PutExperiencesRequest& request, v1::PutExperiencesResponse* response);
  // Where remote payloads are fetched from (not owned; null: they are rejected).
  void SetPayloadFetcher(transport::DescriptorFetcher* fetcher) { fetcher_ = fetcher; }

  // INVALID_ARGUMENT for num_groups outside 1..1024, min_groups > num_groups, wait_ms
  // outside 0..600000, a bad lease TTL, or a current_policy_version above
  // kMaxPolicyVersion or more than kMaxVersionLead ahead of the version the buffer
  // knows. Fewer groups than min_groups after wait_ms is not an error: the response
  // holds what there was (an empty lease id if none). The reply holds fewer groups than
  // asked when the next would take it over kMaxReplyBytes.
  // The reply in wire form: each experience the bytes the buffer keeps (no parse; what
  // the gRPC handler sends). The typed overload parses them.
  absl::Status SampleBatch(const v1::SampleBatchRequest& request, v1::SampleBatchResponseWire* response);
  absl::Status SampleBatch(const v1::SampleBatchRequest& request, v1::SampleBatchResponse* response);

  // INVALID_ARGUMENT for an empty lease_id; NOT_FOUND for an unknown or expired lease
  // (its groups are back in the buffer); UNAVAILABLE if the store cannot record the
  // consumption (the lease stays open). Nack of an acked lease is FAILED_PRECONDITION.
  absl::Status Ack(const v1::AckBatchRequest& request, v1::AckBatchResponse* response);
  absl::Status Nack(const v1::NackBatchRequest& request, v1::NackBatchResponse* response);

  absl::Status GetStats(v1::GetStatsResponse* response);

  // How many consumed or dropped ids stay duplicates (the newest; ids held always are).
  // Without a bound every id ever taken stayed in memory.
  static constexpr size_t kDefaultRememberedRemovedIds = size_t{1} << 18;
  void SetRememberedRemovedIds(size_t n) {
    absl::MutexLock lock(&mu_);
    remembered_removed_ids_ = n;
  }

 private:
  // An accepted experience: its bytes as sent, and what grouping, sampling and the
  // store need of it.
  struct Member {
    std::string bytes;  // serialized v1::Experience
    std::string id;
    float reward = 0;
    uint64_t oldest_version = 0;  // min(token_policy_versions)
    uint64_t segment = 0;         // where the store holds it
  };
  // A Member of `facts` (its bytes and segment are the caller's to set).
  static Member MemberOf(const ExperienceFacts& facts);
  struct Group {
    std::string prompt_id;
    std::vector<Member> members;
    uint64_t bytes = 0;
  };
  struct LeaseState {
    std::vector<std::pair<std::string, Group>> groups;  // by group id
    absl::Time expires_at;
    std::string consumer, incarnation;  // from consumer_id `name#incarnation` (else empty)
  };

  // OK if Configure would take `request`, else INVALID_ARGUMENT naming the field.
  static absl::Status ValidConfig(const v1::ConfigureRequest& request);
  // Ends the leases `ended` picks: their groups go back to the front of the ready queue.
  void EndLeasesLocked(const std::function<bool(const LeaseState&)>& ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns expired leases' groups to the front of the ready queue.
  void ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for the open leases of `consumer`'s incarnations other than `incarnation`
  // (a restarted trainer's predecessor holds them and will never ack).
  void ReleaseEarlierIncarnationsLocked(const std::string& consumer, const std::string& incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TooStaleLocked(uint64_t oldest_version, uint64_t current) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty if `version` (from `field`) is one the buffer may take (see kMaxVersionLead),
  // else why not, naming the field.
  std::string BadVersionLocked(absl::string_view field, uint64_t version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a group adds to a SampleBatch reply, in bytes (its members and framing).
  static uint64_t ReplyBytes(const std::string& group_id, const std::string& prompt_id, uint64_t member_bytes,
                             size_t members);

  // Adds an accepted experience to its group (no store writes; its id is in seen_
  // already).
  void AddLocked(Member m, const std::string& group, const ExperienceFacts& facts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records in the store (if any) that the groups' members are gone, counted under
  // `counter`. Reads only `groups`: callable without the lock (Ack does).
  absl::Status StoreRemoved(const std::vector<const Group*>& groups, const std::string& counter);
  // Forgets a group's members in the store, counting them under `counter`.
  absl::Status ForgetLocked(const std::vector<const Group*>& groups, const std::string& counter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The part of ForgetLocked after the store: removed ids stay duplicates for a while.
  void RememberRemovedLocked(const std::vector<const Group*>& groups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A remote payload's bytes into `out` (checked: the experience `sent` claims to be);
  // empty on success, else why not.
  std::string FetchPayload(const ExperienceFacts& sent, absl::Time deadline, std::string* out);

  common::Clock* const clock_;
  BufferStore* const store_;
  transport::DescriptorFetcher* fetcher_ = nullptr;  // set before serving
  absl::Mutex mu_;
  v1::ConfigureRequest config_ ABSL_GUARDED_BY(mu_);
  // Every id ever accepted, and those of Puts between their decision and their store
  // write (removed again if the write fails).
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Group> filling_ ABSL_GUARDED_BY(mu_);  // groups below group_size
  std::deque<std::pair<std::string, Group>> ready_ ABSL_GUARDED_BY(mu_);  // complete groups
  std::map<std::string, LeaseState> leases_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> acked_leases_ ABSL_GUARDED_BY(mu_);  // (the newest kRememberedAckedLeases)
  // Leases whose ack is being recorded in the store (out of leases_ meanwhile, without
  // the lock held: Puts and samples go on); an Ack or Nack of one waits for it.
  std::set<std::string> acking_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> acked_order_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kRememberedAckedLeases = 4096;
  std::deque<std::string> removed_ids_ ABSL_GUARDED_BY(mu_);  // consumed or dropped, oldest first
  size_t remembered_removed_ids_ ABSL_GUARDED_BY(mu_) = kDefaultRememberedRemovedIds;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // What Puts between their decision and their store write hold back.
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int reserving_puts_ ABSL_GUARDED_BY(mu_) = 0;
  struct Reserved {
    int members = 0;
    uint64_t bytes = 0;
  };
  struct PutPlan;
  // Put's first two passes: reads the experiences, decides under the lock and reserves
  // what it takes (the error, with nothing reserved, when the Put fails as a whole).
  absl::Status PlanPut(v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response, PutPlan* plan);
  // Its last: releases the reservation and takes the experiences once `stored` is OK.
  absl::Status TakePut(PutPlan& plan, const absl::Status& stored, uint64_t segment,
                       v1::PutExperiencesRequestWire* request, v1::PutExperiencesResponse* response);
  absl::flat_hash_map<std::string, Reserved> reserved_groups_ ABSL_GUARDED_BY(mu_);  // group -> being added
  uint64_t current_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t accepted_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t consumed_total_ ABSL_GUARDED_BY(mu_) = 0;
  v1::DropCounts dropped_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> staleness_ ABSL_GUARDED_BY(mu_);  // lag at sampling -> count
};

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_BUFFER_CORE_H_
