// Data-parallel gradient groups over c10d's Gloo backend (CPU, TCP). A group is made
// of a rendezvous (c10d TCPStore: rank 0 serves it, the others connect to it) and a
// ProcessGroupGloo on loopback or a given interface; it implements
// dist::GradientGroup, so Policy::TrainStep all-reduces gradients through it.
//
// This header has no libtorch or Gloo in it; gloo_group.cc is the one file that does.
#ifndef RLFLEET_LIBS_DIST_GLOO_GROUP_H_
#define RLFLEET_LIBS_DIST_GLOO_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/dist/gradient_group.h"

namespace rlfleet::dist {

struct GlooGroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_host = "127.0.0.1";        // where rank 0's Rendezvous listens
  uint16_t store_port = 0;                     // its port (ranks > 0)
  std::string hostname = "127.0.0.1";          // this rank's address for Gloo's connections
  absl::Duration timeout = absl::Seconds(60);  // rendezvous and every collective
};

// The rendezvous store, served by rank 0 (non-blocking); the other ranks connect to
// (store_host, port()).
class Rendezvous {
 public:
  // port 0 picks a free one. UNAVAILABLE if it cannot listen.
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Serve(const std::string& host, uint16_t port, int world_size,
                                                           absl::Duration timeout);
  ~Rendezvous();
  uint16_t port() const;

  class Impl;

 private:
  explicit Rendezvous(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class GlooGroup;
};

class GlooGroup : public dist::GradientGroup {
 public:
  // Joins the group: rank 0 passes the Rendezvous it serves, the others connect to
  // options.store_host:store_port. Blocks until every rank has joined, up to the
  // timeout (DEADLINE_EXCEEDED). INVALID_ARGUMENT for a bad rank / world size.
  static absl::StatusOr<std::unique_ptr<GlooGroup>> Join(const GlooGroupOptions& options, Rendezvous* served = nullptr);
  ~GlooGroup() override;

  int rank() const override;
  int world_size() const override;
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status Broadcast(std::string* bytes) override;
  // Every rank's `mine`, indexed by rank, through the rendezvous store (under `key`:
  // use a new key for each exchange). DEADLINE_EXCEEDED past the group's timeout.
  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& key, const std::string& mine);

  class Impl;

 private:
  explicit GlooGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_GLOO_GROUP_H_
