// The one file of libs/dist that includes libtorch's c10d and Gloo.
#include "libs/dist/gloo_group.h"

#include <torch/torch.h>

#include <chrono>
#include <exception>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlfleet::dist {
namespace {

std::chrono::milliseconds Ms(absl::Duration d) { return std::chrono::milliseconds(absl::ToInt64Milliseconds(d)); }

// c10d and Gloo report failures (a dead peer, a timeout) as exceptions.
absl::Status FromException(const std::exception& e, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", e.what());
  if (message.find("imeout") != std::string::npos || message.find("imed out") != std::string::npos) {
    return absl::DeadlineExceededError(message);
  }
  return absl::UnavailableError(message);
}

}  // namespace

class Rendezvous::Impl {
 public:
  c10::intrusive_ptr<c10d::TCPStore> store;
};

Rendezvous::Rendezvous(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Rendezvous::~Rendezvous() = default;
uint16_t Rendezvous::port() const { return impl_->store->getPort(); }

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Serve(const std::string& host, uint16_t port, int world_size,
                                                              absl::Duration timeout) {
  try {
    c10d::TCPStoreOptions o;
    o.port = port;
    o.isServer = true;
    o.numWorkers = world_size;
    o.waitWorkers = false;  // Join waits, through Gloo's rendezvous
    o.timeout = Ms(timeout);
    auto impl = std::make_unique<Impl>();
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, o);
    return std::unique_ptr<Rendezvous>(new Rendezvous(std::move(impl)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve the rendezvous on ", host, ":", port, ": ", e.what()));
  }
}

class GlooGroup::Impl {
 public:
  GlooGroupOptions options;
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;

  absl::Status Run(std::vector<at::Tensor>& tensors, bool broadcast, absl::string_view what) {
    try {
      c10::intrusive_ptr<c10d::Work> work;
      if (broadcast) {
        c10d::BroadcastOptions b;
        b.rootRank = 0;
        b.timeout = Ms(options.timeout);
        work = group->broadcast(tensors, b);
      } else {
        c10d::AllreduceOptions a;
        a.reduceOp = c10d::ReduceOp::SUM;
        a.timeout = Ms(options.timeout);
        work = group->allreduce(tensors, a);
      }
      if (!work->wait(Ms(options.timeout))) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, " did not finish within ", absl::FormatDuration(options.timeout)));
      }
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return FromException(e, what);
    }
  }
};

GlooGroup::GlooGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GlooGroup::~GlooGroup() = default;

int GlooGroup::rank() const { return impl_->options.rank; }
int GlooGroup::world_size() const { return impl_->options.world_size; }

absl::StatusOr<std::unique_ptr<GlooGroup>> GlooGroup::Join(const GlooGroupOptions& options, Rendezvous* served) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " of world size ", options.world_size, ": want 0 <= rank < world_size"));
  }
  if (options.rank == 0 && served == nullptr) {
    return absl::InvalidArgumentError("rank 0 serves the rendezvous: pass the Rendezvous it serves");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    if (served != nullptr) {
      impl->store = served->impl_->store;
    } else {
      c10d::TCPStoreOptions o;
      o.port = options.store_port;
      o.isServer = false;
      o.timeout = Ms(options.timeout);
      impl->store = c10::make_intrusive<c10d::TCPStore>(options.store_host, o);
    }
    auto gloo = c10d::ProcessGroupGloo::Options::create(Ms(options.timeout));
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    gloo->threads = 1;
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, options.rank, options.world_size, gloo);
  } catch (const std::exception& e) {
    return FromException(e, absl::StrCat("rank ", options.rank, " joining a group of ", options.world_size, " at ",
                                         options.store_host, ":", served ? served->port() : options.store_port));
  }
  return std::unique_ptr<GlooGroup>(new GlooGroup(std::move(impl)));
}

absl::Status GlooGroup::AllReduceSum(float* data, size_t n) {
  // (Metered by the caller, dist::MeteredGroup: this library's metrics would be its own.)
  std::vector<at::Tensor> tensors = {torch::from_blob(data, {static_cast<int64_t>(n)}, torch::kFloat32)};
  return impl_->Run(tensors, /*broadcast=*/false, absl::StrCat("all-reduce of ", n, " floats"));
}

absl::Status GlooGroup::Broadcast(std::string* bytes) {
  // The size first, then the bytes.
  std::vector<at::Tensor> size = {torch::full({1}, static_cast<int64_t>(bytes->size()), torch::kInt64)};
  if (absl::Status s = impl_->Run(size, true, "broadcast of a size"); !s.ok()) return s;
  const int64_t n = size[0].item<int64_t>();
  if (rank() != 0) bytes->resize(n);
  if (n == 0) return absl::OkStatus();
  std::vector<at::Tensor> data = {torch::from_blob(bytes->data(), {n}, torch::kUInt8)};
  return impl_->Run(data, true, absl::StrCat("broadcast of ", n, " bytes"));
}

absl::StatusOr<std::vector<std::string>> GlooGroup::AllGather(const std::string& key, const std::string& mine) {
  const std::string prefix = absl::StrCat("rlfleet/allgather/", key, "/");
  try {
    impl_->store->set(absl::StrCat(prefix, rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> all(world_size());
    for (int r = 0; r < world_size(); ++r) {
      const std::vector<uint8_t> value = impl_->store->get(absl::StrCat(prefix, r));
      all[r].assign(value.begin(), value.end());
    }
    return all;
  } catch (const std::exception& e) {
    return FromException(e, absl::StrCat("all-gather of '", key, "'"));
  }
}

}  // namespace rlfleet::dist
