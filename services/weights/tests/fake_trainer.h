// A trainer for the weights service's tests: it serves each version from memory over a
// loopback data plane, as rlfleet-trainer does over UCX, and can say it also holds the
// version on a GPU of a named host (a device image, as a trainer on CUDA does).
#ifndef RLFLEET_SERVICES_WEIGHTS_TESTS_FAKE_TRAINER_H_
#define RLFLEET_SERVICES_WEIGHTS_TESTS_FAKE_TRAINER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/model/safetensors.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "rlfleet/v1/weights.pb.h"

namespace rlfleet::weights {

struct FakeTrainer {
  std::unique_ptr<transport::LoopbackTransport> transport = transport::LoopbackTransport::Create();
  std::map<uint64_t, std::string> images;               // each version's safetensors image
  std::map<uint64_t, transport::MemoryHandle> handles;  // and its registration

  // The request publishing `version`: one F32 tensor `w` of `floats` floats whose every
  // byte is the version, from this trainer's memory; with `gpu_host`, also a device
  // image of it on that host (its handle a placeholder: nothing maps it in these tests).
  v1::PublishVersionRequest Publish(uint64_t version, size_t floats, const std::string& gpu_host = "") {
    std::map<std::string, model::TensorView> views;
    const std::string w(floats * 4, static_cast<char>(version));
    views["w"] = {"F32", {static_cast<int64_t>(floats)}, w};
    std::string& image = images[version] = model::SerializeSafetensors(views);
    auto handle = transport->RegisterMemory(image.data(), image.size(), transport::MemoryKind::kHost, 0);
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (handle.ok()) handles[version] = *handle;
    v1::PublishVersionRequest r;
    r.mutable_manifest()->mutable_version()->set_version(version);
    v1::TransferDescriptor* where = r.add_sources()->add_shards()->mutable_location();
    if (handle.ok()) *where->mutable_segment() = *transport->Describe(*handle);
    where->set_length_bytes(image.size());
    where->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
    where->mutable_digest()->set_value(common::Xxh64(image));
    if (!gpu_host.empty()) {
      v1::CudaIpcImage* gpu = r.mutable_device_image();
      gpu->set_ipc_handle(std::string(64, 'h'));
      gpu->set_host_id(gpu_host);
      gpu->set_length_bytes(floats * 4);
      gpu->set_version(version);
      gpu->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_BLOCKSUM32_XXH64);
    }
    return r;
  }
};

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_TESTS_FAKE_TRAINER_H_
