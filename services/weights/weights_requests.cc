#include "services/weights/weights_requests.h"

#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/checks.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/reshard/plan.h"
#include "libs/reshard/round.h"
#include "libs/transport/descriptor_fetcher.h"

namespace rlfleet::weights {
namespace {

absl::Status CheckLength(absl::string_view field, const std::string& value, size_t most) {
  if (value.size() <= most) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(), " bytes; at most ", most));
}

// Bytes a layout's tensors hold (ModelLayoutFromProto bounded every shape).
uint64_t LayoutBytes(const reshard::ModelLayout& model) {
  uint64_t bytes = 0;
  for (const reshard::TensorSpec& t : model.tensors) bytes += t.numel() * reshard::DTypeSize(t.dtype);
  return bytes;
}

}  // namespace

absl::Status CheckPublishVersion(const v1::PublishVersionRequest& request, bool sharded, uint64_t max_version_bytes) {
  const v1::WeightManifest& m = request.manifest();
  if (m.version().version() == 0) return absl::InvalidArgumentError("manifest.version.version: 0");
  RETURN_IF_ERROR(CheckLength("manifest.version.run_id", m.version().run_id(), common::kMaxIdBytes));
  RETURN_IF_ERROR(CheckLength("manifest.version.digest", m.version().digest(), 256));
  RETURN_IF_ERROR(CheckLength("publisher_id", request.publisher_id(), common::kMaxIdBytes));
  if (request.has_device_image()) {
    RETURN_IF_ERROR(
        transport::CheckCudaIpcImage(request.device_image(), "device_image", m.version().version(), max_version_bytes));
  }
  RETURN_IF_ERROR(common::CheckInRange<int64_t>("trainer_pause_us", request.trainer_pause_us(), 0,
                                                int64_t{24} * 3600 * 1000 * 1000));
  RETURN_IF_ERROR(
      common::CheckInRange<int64_t>("manifest.created_at_unix_ms", m.created_at_unix_ms(), 0, int64_t{1} << 50));
  if (m.total_bytes() > max_version_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.total_bytes: ", m.total_bytes(), "; at most ",
                                                   max_version_bytes, " here (--max_version_mib)"));
  }
  // The layout, bounded before anything is planned or allocated from it.
  uint64_t layout_bytes = 0;
  int ranks = 1;
  if (m.layout().tensors_size() > 0) {
    ASSIGN_OR_RETURN(reshard::ModelLayout model,
                     reshard::ModelLayoutFromProto(m.layout(), "manifest.layout", kMaxSourceRanks));
    layout_bytes = LayoutBytes(model);
    ranks = model.layout.ranks;
    if (layout_bytes > max_version_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.layout: its tensors hold ", layout_bytes,
                                                     " bytes; at most ", max_version_bytes,
                                                     " here (--max_version_mib)"));
    }
    if (m.wire_dtype() != v1::DTYPE_UNSPECIFIED) {
      for (const v1::TensorLayout& t : m.layout().tensors()) {
        if (t.spec().dtype() != m.wire_dtype()) {
          return absl::UnimplementedError(absl::StrCat(
              "manifest.wire_dtype: ", v1::DType_Name(m.wire_dtype()), " differs from tensor `", t.spec().name(),
              "`'s dtype; this service does not cast (send UNSPECIFIED, or each tensor in its wire dtype)"));
        }
      }
    }
  } else {
    if (m.layout().world_size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest.layout.world_size: ", m.layout().world_size(), " with no tensors listed"));
    }
    if (m.wire_dtype() != v1::DTYPE_UNSPECIFIED) {
      return absl::UnimplementedError(
          "manifest.wire_dtype: a safetensors image travels in its own dtypes; this service does not cast "
          "(send UNSPECIFIED)");
    }
  }
  if (sharded && m.layout().tensors_size() == 0) {
    return absl::InvalidArgumentError("manifest.layout: a sharded version needs its layout");
  }
  if (request.sources_size() > kMaxSourceRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("sources: ", request.sources_size(), " source ranks; at most ", kMaxSourceRanks));
  }
  for (int i = 0; i < request.sources_size(); ++i) {
    const v1::SourceRank& s = request.sources(i);
    const std::string field = absl::StrCat("sources[", i, "]");
    if (s.has_endpoint()) {
      return absl::UnimplementedError(absl::StrCat(
          field, ".endpoint: not used; each shard's location.segment names its data-plane peer (leave it unset)"));
    }
    // (compared in its own type: a rank of 2^31 or more is no negative int here)
    RETURN_IF_ERROR(
        common::CheckInRange<uint32_t>(absl::StrCat(field, ".rank"), s.rank(), 0, static_cast<uint32_t>(ranks - 1)));
    if (s.shards_size() > kMaxTensors) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shards: ", s.shards_size(), " shards; at most ", kMaxTensors));
    }
    for (int j = 0; j < s.shards_size(); ++j) {
      const v1::TransferDescriptor& where = s.shards(j).location();
      const std::string at = absl::StrCat(field, ".shards[", j, "].location");
      if (where.length_bytes() > max_version_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(at, ".length_bytes: ", where.length_bytes(), "; at most ",
                                                       max_version_bytes, " here (--max_version_mib)"));
      }
      RETURN_IF_ERROR(CheckLength(absl::StrCat(at, ".segment.worker_address"), where.segment().worker_address(), 4096));
      RETURN_IF_ERROR(CheckLength(absl::StrCat(at, ".segment.packed_rkey"), where.segment().packed_rkey(), 4096));
    }
  }
  if (m.total_bytes() != 0) {
    const uint64_t expected = sharded ? layout_bytes
                              : request.sources_size() == 1 && request.sources(0).shards_size() == 1
                                  ? request.sources(0).shards(0).location().length_bytes()
                                  : m.total_bytes();
    if (m.total_bytes() != expected) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.total_bytes: ", m.total_bytes(), "; the ",
                                                     sharded ? "layout's tensors hold " : "image is ", expected));
    }
  }
  // Shard digests: one per (rank, tensor) of a sharded layout, each the digest its
  // shard's descriptor carries (checked where the shard is pulled).
  if (m.shard_digests_size() > 0) {
    if (!sharded) {
      return absl::InvalidArgumentError(
          "manifest.shard_digests: only for a sharded version (the image's digest is its descriptor's)");
    }
    if (m.shard_digests_size() != ranks * m.layout().tensors_size()) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.shard_digests: ", m.shard_digests_size(),
                                                     " digests; the layout has ", ranks, " ranks x ",
                                                     m.layout().tensors_size(), " tensors"));
    }
    std::set<std::string> names;
    for (const v1::TensorLayout& t : m.layout().tensors()) names.insert(t.spec().name());
    std::set<std::pair<uint32_t, std::string>> seen;
    for (int i = 0; i < m.shard_digests_size(); ++i) {
      const v1::ShardDigest& d = m.shard_digests(i);
      const std::string field = absl::StrCat("manifest.shard_digests[", i, "]");
      RETURN_IF_ERROR(
          common::CheckInRange<uint32_t>(absl::StrCat(field, ".rank"), d.rank(), 0, static_cast<uint32_t>(ranks - 1)));
      if (!names.count(d.tensor_name()) || !seen.emplace(d.rank(), d.tensor_name()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".tensor_name: `", d.tensor_name(), "` ",
                         names.count(d.tensor_name()) ? "appears twice for its rank" : "is not in the layout"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRegisterDestination(const v1::RegisterDestinationRequest& request) {
  if (request.replica_id().empty() || request.replica_id().size() > common::kMaxIdBytes) {
    return absl::InvalidArgumentError("replica_id: want 1..128 bytes");
  }
  if (request.grpc_address().empty()) return absl::InvalidArgumentError("grpc_address: empty");
  RETURN_IF_ERROR(CheckLength("grpc_address", request.grpc_address(), 512));
  if (request.layout().tensors_size() > 0) {
    // The layout names its tensors and their splits (their specs, where given, must be
    // the published version's: GetPlan compares them).
    const v1::ShardLayout& layout = request.layout();
    RETURN_IF_ERROR(common::CheckInRange<uint32_t>("layout.world_size", layout.world_size(), 1, kMaxDestinationRanks));
    if (layout.tensors_size() > kMaxTensors) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout.tensors: ", layout.tensors_size(), " tensors; at most ", kMaxTensors));
    }
    std::set<std::string> names;
    for (int i = 0; i < layout.tensors_size(); ++i) {
      const v1::TensorLayout& t = layout.tensors(i);
      const std::string field = absl::StrCat("layout.tensors[", i, "]");
      if (t.spec().name().empty() || !names.insert(t.spec().name()).second) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".spec.name: `", t.spec().name(), "` ",
                                                       t.spec().name().empty() ? "is empty" : "given twice"));
      }
      RETURN_IF_ERROR(common::Annotate(reshard::SplitFromProto(t.kind(), t.spec().name()).status(), field));
      if (t.spec().dtype() != v1::DTYPE_UNSPECIFIED) {
        RETURN_IF_ERROR(common::Annotate(reshard::DTypeFromProto(t.spec().dtype(), t.spec().name()).status(), field));
      }
      if (t.spec().shape_size() > 8) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".spec.shape: ", t.spec().shape_size(), " dimensions; at most 8"));
      }
      if (t.spec().shape_size() > 0) {  // (where given, a shape must be one a plan can hold)
        RETURN_IF_ERROR(reshard::CheckedElements(absl::StrCat(field, ".spec.shape"), t.spec().shape()).status());
      }
    }
  } else if (request.layout().world_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.world_size: ", request.layout().world_size(),
                     " with no tensors listed (no tensors: one rank holding every tensor whole)"));
  }
  if (request.ranks_size() > 0) {
    return absl::UnimplementedError(
        "ranks: per-rank staging memory is not used; a replica's data plane comes from its GetInfo (leave it "
        "empty)");
  }
  if (request.wire_dtype() != v1::DTYPE_UNSPECIFIED) {
    return absl::UnimplementedError(absl::StrCat("wire_dtype: ", v1::DType_Name(request.wire_dtype()),
                                                 "; this service does not cast (send UNSPECIFIED: as published)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSyncVersion(const v1::SyncVersionRequest& request) {
  RETURN_IF_ERROR(common::CheckInRange<int64_t>("timeout_ms", request.timeout_ms(), 0, kMaxSyncTimeoutMs));
  if (!request.commit()) {
    return absl::UnimplementedError(
        "commit: false (stage without installing) is not supported; a synced version is installed (send true)");
  }
  if (!request.replica_id().empty() && request.replica_ids_size() > 0) {
    return absl::InvalidArgumentError("replica_ids: give either replica_id or replica_ids");
  }
  if (request.replica_ids_size() > kMaxReplicaIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica_ids: ", request.replica_ids_size(), "; at most ", kMaxReplicaIds));
  }
  RETURN_IF_ERROR(CheckLength("replica_id", request.replica_id(), common::kMaxIdBytes));
  for (int i = 0; i < request.replica_ids_size(); ++i) {
    const std::string& id = request.replica_ids(i);
    if (id.empty() || id.size() > common::kMaxIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("replica_ids[", i, "]: want 1..128 bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::weights
