// WeightIntake without gRPC: a replica (a real RolloutCore) takes versions pulled from
// a peer's memory, relayed on from another replica, pushed by a resharding round (also
// mapped, where what is installed is the checked private copy), or read from a FILE,
// all over loopback transports; and refuses bad requests naming the field before
// anything is fetched.
#include "services/rollout/weight_intake.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"
#include "libs/reshard/executor.h"
#include "libs/transport/loopback/loopback_transport.h"

namespace rlfleet::rollout {
namespace {

using transport::LoopbackTransport;

// A replica: its core (version 1 installed) and intake over its own loopback transport.
struct Replica {
  explicit Replica(const std::string& file_root = "") {
    core = std::move(*RolloutCore::Create(model::TinyConfig(), model::TestDevice()));
    EXPECT_TRUE(core->InstallInitial(1).ok());
    transport::DescriptorFetcher::Options options;
    options.max_bytes = 64 << 20;
    options.file_root = file_root;
    fetcher = std::make_unique<transport::DescriptorFetcher>(data_plane.get(), options);
    intake = std::make_unique<WeightIntake>(core.get(), fetcher.get(), data_plane.get());
  }
  std::unique_ptr<RolloutCore> core;
  std::unique_ptr<LoopbackTransport> data_plane = LoopbackTransport::Create();
  std::unique_ptr<transport::DescriptorFetcher> fetcher;
  std::unique_ptr<WeightIntake> intake;
};

// Another policy's weights (seed 7) as a safetensors image.
std::string OtherImage() {
  auto other = model::Policy::Create(model::TinyConfig(), model::TestDevice(), /*init_seed=*/7);
  return (*other)->SafetensorsBytes();
}

// `image`'s length and digest on `d`.
v1::TransferDescriptor Describing(v1::TransferDescriptor d, const std::string& image) {
  d.set_length_bytes(image.size());
  d.mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  d.mutable_digest()->set_value(common::Xxh64(image));
  return d;
}

// `image` registered on a loopback transport of its own (the weights service's memory,
// say), and the descriptor to pull it by.
struct Served {
  explicit Served(const std::string& image) {
    auto handle = owner->RegisterMemory(const_cast<char*>(image.data()), image.size(), transport::MemoryKind::kHost, 0);
    EXPECT_TRUE(handle.ok()) << handle.status();
    v1::TransferDescriptor d;
    if (handle.ok()) *d.mutable_segment() = *owner->Describe(*handle);
    source = Describing(d, image);
  }
  std::unique_ptr<LoopbackTransport> owner = LoopbackTransport::Create();
  v1::TransferDescriptor source;
};

v1::PrepareWeightsRequest Pull(uint64_t version, const v1::TransferDescriptor& source) {
  v1::PrepareWeightsRequest r;
  r.mutable_manifest()->mutable_version()->set_version(version);
  *r.add_chunks()->mutable_source() = source;
  r.set_transfer_timeout_ms(20000);
  return r;
}

// The greedy continuation of one prompt: equal for equal weights.
std::vector<int32_t> Greedy(RolloutCore& core) {
  v1::GenerateBatchRequest r;
  r.set_request_id("g");
  r.set_num_samples(1);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_new_tokens(6);
  r.mutable_sampling()->set_ignore_eos(true);
  v1::BatchPrompt* p = r.add_prompts();
  p->set_prompt_id("p");
  const auto ids = model::Tokenizer::EncodePrompt("reverse:123");  // (kept alive for the loop)
  for (int32_t id : *ids) p->add_prompt_token_ids(id);
  v1::GenerateBatchResponse out;
  absl::Status s = core.GenerateBatch(r, &out, absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
  if (out.completions_size() == 0) return {};
  return {out.completions(0).response_token_ids().begin(), out.completions(0).response_token_ids().end()};
}

TEST(WeightIntake, APulledVersionInstallsAndIsRelayedToTheNextReplica) {
  const std::string image = OtherImage();
  const Served served(image);
  const v1::TransferDescriptor& source = served.source;

  Replica first, second;
  v1::PrepareWeightsRequest pull = Pull(2, source);
  pull.set_serve_relay(true);
  v1::CommitWeightsResponse r1;
  ASSERT_TRUE(first.intake->Update(pull, absl::Now() + absl::Seconds(30), &r1).ok());
  EXPECT_EQ(r1.installed_version().version(), 2u);
  EXPECT_EQ(first.core->installed_version(), 2u);
  EXPECT_GT(r1.pull_us(), 0);
  ASSERT_TRUE(r1.has_relay_source()) << "the pulled version is served from here";
  EXPECT_EQ(r1.relay_source().length_bytes(), image.size());
  EXPECT_EQ(r1.relay_source().digest().value(), source.digest().value());

  // The next replica pulls from the first (not from the owner) and ends with the same weights.
  v1::CommitWeightsResponse r2;
  ASSERT_TRUE(second.intake->Update(Pull(2, r1.relay_source()), absl::Now() + absl::Seconds(30), &r2).ok());
  EXPECT_EQ(second.core->installed_version(), 2u);
  EXPECT_EQ(Greedy(*first.core), Greedy(*second.core));

  // A digest that does not match is DATA_LOSS and installs nothing.
  v1::TransferDescriptor wrong = source;
  wrong.mutable_digest()->set_value(source.digest().value() ^ 1);
  v1::CommitWeightsResponse r3;
  EXPECT_EQ(second.intake->Update(Pull(3, wrong), absl::Now() + absl::Seconds(30), &r3).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(second.core->installed_version(), 2u);
}

// A round from one source rank holding `image`'s tensors whole to one replica (TP 1),
// run on a thread of its own; the round the replica is told.
struct PushSource {
  std::unique_ptr<LoopbackTransport> transport = LoopbackTransport::Create();
  std::vector<uint8_t> shard;
  std::thread thread;
  absl::Status status;
  v1::ReshardRound round;

  PushSource(const std::string& image, const std::string& destination, bool mapped) {
    auto views = model::ParseSafetensorsViews(image, "image");
    EXPECT_TRUE(views.ok()) << views.status();
    std::vector<reshard::TensorSpec> tensors;
    for (const auto& [name, view] : *views) tensors.push_back({name, view.shape, reshard::DType::kF32});
    const reshard::Layout whole =
        reshard::Layout::Tp(1, std::vector<reshard::Split>(tensors.size(), reshard::Split::kReplicated));
    reshard::Plan plan = *reshard::MakePlan(tensors, whole, whole);
    shard.resize(plan.src_shard_bytes[0]);
    for (size_t t = 0; t < plan.tensors.size(); ++t) {
      const auto& view = views->at(plan.tensors[t].name);
      std::memcpy(shard.data() + plan.src_parts[0][t].offset, view.bytes.data(), view.bytes.size());
    }
    *round.mutable_source_layout() = reshard::ModelLayoutToProto(tensors, whole);
    *round.mutable_destination_layout() = reshard::ModelLayoutToProto(tensors, whole);
    round.add_source_addresses(transport->LocalAddress());
    round.add_digest_shares((*reshard::SourceDigestShares(plan, 0, shard.data()))[0]);
    round.set_map_peer_memory(mapped);
    round.set_round_timeout_ms(20000);
    transport::PeerId peer = *transport->Connect(destination);
    thread = std::thread([this, plan, peer, mapped] {
      auto handle = transport->RegisterMemory(shard.data(), shard.size(), transport::MemoryKind::kHost, 0);
      if (!handle.ok()) {
        status = handle.status();
        return;
      }
      reshard::SourceRole role{0, *handle, {peer}};
      reshard::ExecutorOptions options;
      options.map_peer_memory = mapped;
      options.timeout = absl::Seconds(20);
      auto ops = reshard::NewHostMemoryOps();
      status = reshard::Execute(*transport, plan, &role, nullptr, *ops, options).status();
    });
  }
  ~PushSource() {
    if (thread.joinable()) thread.join();
  }
};

TEST(WeightIntake, APushedVersionInstallsMappedOrNot) {
  const std::string image = OtherImage();
  Replica reference;  // the same weights by pull, to compare with
  {
    const Served served(image);
    v1::CommitWeightsResponse r;
    ASSERT_TRUE(reference.intake->Update(Pull(2, served.source), absl::Now() + absl::Seconds(30), &r).ok());
  }
  for (bool mapped : {false, true}) {
    SCOPED_TRACE(mapped ? "mapped" : "tagged");
    Replica replica;
    PushSource source(image, replica.data_plane->LocalAddress(), mapped);
    v1::PrepareWeightsRequest push;
    push.mutable_manifest()->mutable_version()->set_version(2);
    *push.mutable_reshard() = source.round;
    v1::CommitWeightsResponse r;
    absl::Status s = replica.intake->Update(push, absl::Now() + absl::Seconds(30), &r);
    source.thread.join();
    ASSERT_TRUE(source.status.ok()) << source.status;
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(r.installed_version().version(), 2u);
    EXPECT_EQ(Greedy(*replica.core), Greedy(*reference.core));
    // An older or equal version is refused before the replica joins a round.
    v1::CommitWeightsResponse again;
    EXPECT_EQ(replica.intake->Update(push, absl::Now() + absl::Seconds(5), &again).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST(WeightIntake, AFileVersionComesOnlyFromUnderTheRoot) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/intake-publish";
  std::filesystem::create_directories(root);
  const std::string image = OtherImage();
  std::ofstream(root + "/v2.safetensors", std::ios::binary) << image;
  v1::TransferDescriptor file;
  file.mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
  file.mutable_segment()->set_worker_address("v2.safetensors");
  file = Describing(file, image);
  Replica replica(root);
  v1::CommitWeightsResponse r;
  ASSERT_TRUE(replica.intake->Update(Pull(2, file), absl::Now() + absl::Seconds(30), &r).ok());
  EXPECT_EQ(replica.core->installed_version(), 2u);
  file.mutable_segment()->set_worker_address("/etc/passwd");
  EXPECT_EQ(replica.intake->Update(Pull(3, file), absl::Now() + absl::Seconds(30), &r).code(),
            absl::StatusCode::kInvalidArgument);
  // No fetcher at all: FILE is refused naming the backend.
  WeightIntake bare(replica.core.get(), nullptr, nullptr);
  absl::Status s = bare.Update(Pull(3, file), absl::Now() + absl::Seconds(5), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "chunks[0].source.segment.backend")) << s;
}

TEST(WeightIntake, BadRequestsAreRefusedNamingTheFieldBeforeAnythingMoves) {
  Replica replica;
  v1::TransferDescriptor source;  // never fetched: every case is refused first
  source.set_length_bytes(1024);
  struct Case {
    std::function<void(v1::PrepareWeightsRequest&)> change;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.mutable_manifest()->mutable_version()->set_version(0); }, absl::StatusCode::kInvalidArgument,
       "manifest.version.version"},
      {[](auto& r) { r.set_transfer_timeout_ms(-1); }, absl::StatusCode::kInvalidArgument, "transfer_timeout_ms"},
      {[](auto& r) { r.mutable_manifest()->set_wire_dtype(v1::DTYPE_BFLOAT16); }, absl::StatusCode::kUnimplemented,
       "manifest.wire_dtype"},
      {[](auto& r) { r.add_chunks(); }, absl::StatusCode::kUnimplemented, "chunks"},
      {[](auto& r) { r.mutable_chunks(0)->set_dst_rank(3); }, absl::StatusCode::kUnimplemented, "chunks[0]"},
      {[](auto& r) { r.mutable_chunks(0)->mutable_source()->set_length_bytes(uint64_t{1} << 40); },
       absl::StatusCode::kInvalidArgument, "chunks[0].source.length_bytes"},
      {[](auto& r) { r.mutable_manifest()->set_total_bytes(7); }, absl::StatusCode::kInvalidArgument,
       "manifest.total_bytes"},
      {[](auto& r) { r.mutable_reshard(); }, absl::StatusCode::kInvalidArgument, "chunks"},
  };
  for (const Case& k : cases) {
    v1::PrepareWeightsRequest r = Pull(2, source);
    k.change(r);
    v1::CommitWeightsResponse out;
    absl::Status s = replica.intake->Update(r, absl::Now() + absl::Seconds(5), &out);
    EXPECT_EQ(s.code(), k.code) << k.field << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), k.field)) << s;
  }
  EXPECT_EQ(replica.core->installed_version(), 1u);
}

}  // namespace
}  // namespace rlfleet::rollout
