// The far side of a transport conformance test. The test drives its own Transport
// directly and the peer through this interface, so one suite covers a peer in the same
// process (TransportPeer) and one in another process (ProcessPeer, which talks to the
// transport_peer binary over stdin/stdout).
#ifndef RLFLEET_LIBS_TRANSPORT_TESTS_PEER_H_
#define RLFLEET_LIBS_TRANSPORT_TESTS_PEER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport::testing {

class Peer {
 public:
  virtual ~Peer() = default;
  virtual absl::StatusOr<std::string> Address() = 0;
  // Connects the peer's transport to `address` (the test's transport).
  virtual absl::Status ConnectTo(const std::string& address) = 0;
  // Allocates and registers `size` bytes filled with pattern `seed`; returns a slot.
  // With `native`, the transport allocates them (Transport::AllocateMemory).
  virtual absl::StatusOr<int> Allocate(uint64_t size, uint64_t seed, bool native = false) = 0;
  virtual absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(int slot) = 0;
  // Byte-for-byte check of slot[offset, +length) against pattern `seed` from pattern_offset.
  virtual absl::Status Verify(int slot, uint64_t offset, uint64_t length, uint64_t seed, uint64_t pattern_offset) = 0;
  virtual absl::Status Deregister(int slot) = 0;
  // Posts a receive (from the connected test transport) into a fresh buffer.
  virtual absl::StatusOr<int> PostRecv(uint64_t tag, uint64_t capacity) = 0;
  // Waits for it; checks it received `length` bytes of pattern `seed`.
  virtual absl::Status WaitRecv(int recv, uint64_t length, uint64_t seed, absl::Duration timeout) = 0;
  // Sends `length` bytes of pattern `seed` to the test transport.
  virtual absl::StatusOr<int> PostSend(uint64_t tag, uint64_t length, uint64_t seed) = 0;
  virtual absl::Status WaitSend(int send, absl::Duration timeout) = 0;
  // Dies without cleaning up (SIGKILL for a process; Close() in process where possible).
  virtual void Kill() = 0;
  // The peer's process (to stop and continue it); 0 for a peer in this process.
  virtual pid_t pid() const { return 0; }
};

// A Peer over a Transport in this process. Not thread-safe (one test thread).
class TransportPeer : public Peer {
 public:
  // `on_kill` simulates death (e.g. LoopbackTransport::Close); may be empty.
  TransportPeer(std::unique_ptr<Transport> transport, std::function<void()> on_kill = {});
  ~TransportPeer() override;

  absl::StatusOr<std::string> Address() override;
  absl::Status ConnectTo(const std::string& address) override;
  absl::StatusOr<int> Allocate(uint64_t size, uint64_t seed, bool native = false) override;
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(int slot) override;
  absl::Status Verify(int slot, uint64_t offset, uint64_t length, uint64_t seed, uint64_t pattern_offset) override;
  absl::Status Deregister(int slot) override;
  absl::StatusOr<int> PostRecv(uint64_t tag, uint64_t capacity) override;
  absl::Status WaitRecv(int recv, uint64_t length, uint64_t seed, absl::Duration timeout) override;
  absl::StatusOr<int> PostSend(uint64_t tag, uint64_t length, uint64_t seed) override;
  absl::Status WaitSend(int send, absl::Duration timeout) override;
  void Kill() override;

  Transport* transport() { return transport_.get(); }

 private:
  struct Buffer {
    std::vector<uint8_t> bytes;  // empty when the transport allocated the memory
    MemoryHandle handle;
    bool registered = false;
    uint8_t* data() { return bytes.empty() ? static_cast<uint8_t*>(handle.base) : bytes.data(); }
    uint64_t size() const { return bytes.empty() ? handle.length : bytes.size(); }
  };
  struct Op {
    std::unique_ptr<Buffer> buffer;
    std::unique_ptr<Completion> completion;
  };
  absl::StatusOr<std::unique_ptr<Buffer>> NewBuffer(uint64_t size);

  std::unique_ptr<Transport> transport_;
  std::function<void()> on_kill_;
  PeerId test_peer_ = 0;
  std::map<int, std::unique_ptr<Buffer>> slots_;
  std::map<int, Op> ops_;
  int next_ = 1;
};

// Starts the transport_peer binary (`argv`) and drives it over its stdin/stdout.
std::unique_ptr<Peer> StartProcessPeer(const std::vector<std::string>& argv);

// The command loop of the transport_peer binary: reads commands on stdin, answers on
// stdout, until EOF. Returns the process exit code.
int RunPeerCommandLoop(TransportPeer& peer);

}  // namespace rlfleet::transport::testing

#endif  // RLFLEET_LIBS_TRANSPORT_TESTS_PEER_H_
