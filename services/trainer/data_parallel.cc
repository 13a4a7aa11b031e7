#include "services/trainer/data_parallel.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/hosts.h"
#include "libs/common/status_macros.h"
#include "libs/dist/metered_group.h"
#include "libs/dist/transport_group.h"

namespace rlfleet::trainer {

absl::StatusOr<DataParallel> JoinDataParallel(const DataParallelOptions& options,
                                              const std::function<void(const std::string&)>& log) {
  const std::string& allreduce = options.allreduce;
  const std::string& wire = options.wire;
  if (allreduce != "gloo" && allreduce != "ring" && allreduce != "hierarchical") {
    return absl::InvalidArgumentError(absl::StrCat("--dp_allreduce=", allreduce, ": want gloo, ring or hierarchical"));
  }
  if (wire != "fp32" && wire != "bf16" && wire != "fp16") {
    return absl::InvalidArgumentError(absl::StrCat("--dp_wire=", wire, ": want fp32, bf16 or fp16"));
  }
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dp_rank=", options.rank, " --dp_world=", options.world, ": want 0 <= rank < world"));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--dp_port=", options.port, ": want 0..65535"));
  }
  DataParallel out;
  if (options.world == 1) return out;
  dist::GlooGroupOptions o;
  o.rank = options.rank;
  o.world_size = options.world;
  o.store_host = o.hostname = options.host;
  o.store_port = static_cast<uint16_t>(options.port);
  o.timeout = options.timeout;
  if (options.rank == 0) {
    ASSIGN_OR_RETURN(out.rendezvous, dist::Rendezvous::Serve(o.store_host, o.store_port, options.world, o.timeout));
    log(absl::StrCat("dp rendezvous on ", o.store_host, ":", out.rendezvous->port(), " (waiting for ",
                     options.world - 1, " more ranks)"));
  }
  absl::StatusOr<std::unique_ptr<dist::GlooGroup>> joined = dist::GlooGroup::Join(o, out.rendezvous.get());
  if (!joined.ok()) return common::Annotate(joined.status(), absl::StrCat("rank ", options.rank));
  if (allreduce == "gloo") {
    out.group = std::make_unique<dist::MeteredGroup>(std::move(*joined), "gloo");
  } else {
    dist::TransportGroupOptions t;
    t.node = options.node;
    if (t.node.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      t.node = host;
    }
    t.hierarchical = allreduce == "hierarchical";
    t.precision = wire == "bf16"   ? dist::WirePrecision::kBf16
                  : wire == "fp16" ? dist::WirePrecision::kFp16
                                   : dist::WirePrecision::kFp32;
    t.timeout = options.timeout;
    // Ranks on one host (a loopback rendezvous) keep UCX on loopback; otherwise every
    // interface, so that ranks on other hosts can reach this one.
    t.loopback_only = common::IsLoopbackHost(o.store_host);
    absl::StatusOr<std::unique_ptr<dist::TransportGroup>> made = dist::TransportGroup::Create(std::move(*joined), t);
    if (!made.ok()) return common::Annotate(made.status(), absl::StrCat("rank ", options.rank));
    log(absl::StrCat("rank ", options.rank, ": all-reduce ", (*made)->hierarchical() ? "hierarchical" : "ring",
                     " over ", (*made)->topology().nodes.size(), " node(s), wire ", wire));
    out.group = std::move(*made);
  }
  log(absl::StrCat("rank ", options.rank, " of ", options.world, " joined"));
  return out;
}

}  // namespace rlfleet::trainer
