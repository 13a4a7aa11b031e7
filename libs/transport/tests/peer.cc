#include "libs/transport/tests/peer.h"

#include <signal.h>

#include <iostream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/status_macros.h"
#include "libs/transport/tests/pattern.h"
#include "tests/util/subprocess.h"

namespace rlfleet::transport::testing {

// ---- TransportPeer ----

TransportPeer::TransportPeer(std::unique_ptr<Transport> transport, std::function<void()> on_kill)
    : transport_(std::move(transport)), on_kill_(std::move(on_kill)) {}

TransportPeer::~TransportPeer() {
  // Let transfers still in flight finish (or fail) before their buffers go away.
  for (auto& [id, op] : ops_) {
    if (op.completion) (void)op.completion->Wait(absl::Seconds(5));
  }
  ops_.clear();
  slots_.clear();
  transport_.reset();
}

absl::StatusOr<std::string> TransportPeer::Address() {
  if (transport_ == nullptr) return absl::UnavailableError("peer was killed");
  return transport_->LocalAddress();
}

absl::Status TransportPeer::ConnectTo(const std::string& address) {
  ASSIGN_OR_RETURN(test_peer_, transport_->Connect(address));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TransportPeer::Buffer>> TransportPeer::NewBuffer(uint64_t size) {
  if (transport_ == nullptr) return absl::UnavailableError("peer was killed");
  auto buffer = std::make_unique<Buffer>();
  buffer->bytes.resize(size);
  ASSIGN_OR_RETURN(buffer->handle, transport_->RegisterMemory(buffer->bytes.data(), size));
  buffer->registered = true;
  return buffer;
}

absl::StatusOr<int> TransportPeer::Allocate(uint64_t size, uint64_t seed, bool native) {
  std::unique_ptr<Buffer> buffer;
  if (native) {
    if (transport_ == nullptr) return absl::UnavailableError("peer was killed");
    buffer = std::make_unique<Buffer>();
    ASSIGN_OR_RETURN(buffer->handle, transport_->AllocateMemory(size));
    buffer->registered = true;
  } else {
    ASSIGN_OR_RETURN(buffer, NewBuffer(size));
  }
  FillPattern(buffer->data(), size, seed, 0);
  const int slot = next_++;
  slots_[slot] = std::move(buffer);
  return slot;
}

absl::StatusOr<v1::RemoteMemoryDescriptor> TransportPeer::Describe(int slot) {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return absl::NotFoundError(absl::StrCat("no slot ", slot));
  return transport_->Describe(it->second->handle);
}

absl::Status TransportPeer::Verify(int slot, uint64_t offset, uint64_t length, uint64_t seed, uint64_t pattern_offset) {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return absl::NotFoundError(absl::StrCat("no slot ", slot));
  RETURN_IF_ERROR(CheckRange("Verify", offset, length, it->second->size()));
  return VerifyPattern(it->second->data() + offset, length, seed, pattern_offset);
}

absl::Status TransportPeer::Deregister(int slot) {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return absl::NotFoundError(absl::StrCat("no slot ", slot));
  RETURN_IF_ERROR(transport_->DeregisterMemory(it->second->handle));
  it->second->registered = false;
  return absl::OkStatus();  // the bytes stay allocated: a stale Put must not hit freed memory
}

absl::StatusOr<int> TransportPeer::PostRecv(uint64_t tag, uint64_t capacity) {
  ASSIGN_OR_RETURN(auto buffer, NewBuffer(capacity));
  Op op;
  op.completion = transport_->Recv(test_peer_, tag, buffer->handle, 0, capacity);
  op.buffer = std::move(buffer);
  const int id = next_++;
  ops_[id] = std::move(op);
  return id;
}

absl::Status TransportPeer::WaitRecv(int recv, uint64_t length, uint64_t seed, absl::Duration timeout) {
  auto it = ops_.find(recv);
  if (it == ops_.end()) return absl::NotFoundError(absl::StrCat("no receive ", recv));
  RETURN_IF_ERROR(it->second.completion->Wait(timeout));
  if (it->second.completion->bytes() != length) {
    return absl::DataLossError(absl::StrCat("received ", it->second.completion->bytes(), " bytes, expected ", length));
  }
  absl::Status status = VerifyPattern(it->second.buffer->bytes.data(), length, seed, 0);
  ops_.erase(it);
  return status;
}

absl::StatusOr<int> TransportPeer::PostSend(uint64_t tag, uint64_t length, uint64_t seed) {
  ASSIGN_OR_RETURN(auto buffer, NewBuffer(length));
  FillPattern(buffer->bytes.data(), length, seed, 0);
  Op op;
  op.completion = transport_->Send(test_peer_, tag, buffer->handle, 0, length);
  op.buffer = std::move(buffer);
  const int id = next_++;
  ops_[id] = std::move(op);
  return id;
}

absl::Status TransportPeer::WaitSend(int send, absl::Duration timeout) {
  auto it = ops_.find(send);
  if (it == ops_.end()) return absl::NotFoundError(absl::StrCat("no send ", send));
  absl::Status status = it->second.completion->Wait(timeout);
  if (!absl::IsDeadlineExceeded(status)) ops_.erase(it);
  return status;
}

void TransportPeer::Kill() {
  if (on_kill_) {
    on_kill_();
    return;
  }
  // Without a backend-specific way to die, destroying the transport closes its
  // endpoints, which is what the other side sees of a dead process.
  for (auto& [id, op] : ops_) {
    if (op.completion) (void)op.completion->Wait(absl::Milliseconds(10));
  }
  transport_.reset();
}

// ---- the command protocol ----
//
// One command per line, one answer per line: "OK [payload]" or "ERR <code> <message>".
// Binary payloads (addresses, descriptors) travel as hex.

namespace {

std::string Answer(const absl::Status& status, const std::string& payload = "") {
  if (!status.ok()) {
    std::string message(status.message());
    std::replace(message.begin(), message.end(), '\n', ' ');
    return absl::StrCat("ERR ", static_cast<int>(status.code()), " ", message);
  }
  return payload.empty() ? "OK" : absl::StrCat("OK ", payload);
}

template <typename T>
std::string AnswerOr(const absl::StatusOr<T>& value) {
  if (!value.ok()) return Answer(value.status());
  return Answer(absl::OkStatus(), absl::StrCat(*value));
}

uint64_t U(const std::vector<std::string>& args, size_t i) {
  uint64_t v = 0;
  if (i < args.size()) (void)absl::SimpleAtoi(args[i], &v);
  return v;
}

class ProcessPeer : public Peer {
 public:
  explicit ProcessPeer(std::unique_ptr<rlfleet::testing::Subprocess> process) : process_(std::move(process)) {}
  ~ProcessPeer() override = default;
  pid_t pid() const override { return process_->pid(); }

  absl::StatusOr<std::string> Address() override {
    ASSIGN_OR_RETURN(std::string hex, Call("ADDRESS"));
    return absl::HexStringToBytes(hex);
  }
  absl::Status ConnectTo(const std::string& address) override {
    return Call(absl::StrCat("CONNECT ", absl::BytesToHexString(address))).status();
  }
  absl::StatusOr<int> Allocate(uint64_t size, uint64_t seed, bool native) override {
    return Int(Call(absl::StrCat("ALLOC ", size, " ", seed, " ", native ? 1 : 0)));
  }
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(int slot) override {
    ASSIGN_OR_RETURN(std::string hex, Call(absl::StrCat("DESCRIBE ", slot)));
    v1::RemoteMemoryDescriptor d;
    if (!d.ParseFromString(absl::HexStringToBytes(hex))) {
      return absl::InternalError("peer sent an unparsable descriptor");
    }
    return d;
  }
  absl::Status Verify(int slot, uint64_t offset, uint64_t length, uint64_t seed, uint64_t pattern_offset) override {
    return Call(absl::StrCat("VERIFY ", slot, " ", offset, " ", length, " ", seed, " ", pattern_offset)).status();
  }
  absl::Status Deregister(int slot) override { return Call(absl::StrCat("DEREG ", slot)).status(); }
  absl::StatusOr<int> PostRecv(uint64_t tag, uint64_t capacity) override {
    return Int(Call(absl::StrCat("POSTRECV ", tag, " ", capacity)));
  }
  absl::Status WaitRecv(int recv, uint64_t length, uint64_t seed, absl::Duration timeout) override {
    return Call(absl::StrCat("WAITRECV ", recv, " ", length, " ", seed, " ", absl::ToInt64Milliseconds(timeout)),
                timeout + absl::Seconds(30))
        .status();
  }
  absl::StatusOr<int> PostSend(uint64_t tag, uint64_t length, uint64_t seed) override {
    return Int(Call(absl::StrCat("POSTSEND ", tag, " ", length, " ", seed)));
  }
  absl::Status WaitSend(int send, absl::Duration timeout) override {
    return Call(absl::StrCat("WAITSEND ", send, " ", absl::ToInt64Milliseconds(timeout)), timeout + absl::Seconds(30))
        .status();
  }
  void Kill() override {
    (void)process_->Signal(SIGKILL);
    (void)process_->Wait(absl::Seconds(10));
  }

 private:
  absl::StatusOr<std::string> Call(const std::string& command, absl::Duration timeout = absl::Seconds(60)) {
    RETURN_IF_ERROR(process_->WriteLine(command));
    ASSIGN_OR_RETURN(
        std::string line,
        process_->WaitForLine(
            [](const std::string& l) { return absl::StartsWith(l, "OK") || absl::StartsWith(l, "ERR "); }, timeout));
    if (absl::StartsWith(line, "OK")) return line.size() > 3 ? line.substr(3) : "";
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    int code = 2;
    (void)absl::SimpleAtoi(parts.size() > 1 ? parts[1] : "2", &code);
    return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat("peer: ", parts.size() > 2 ? parts[2] : ""));
  }
  static absl::StatusOr<int> Int(absl::StatusOr<std::string> s) {
    if (!s.ok()) return s.status();
    int v = 0;
    if (!absl::SimpleAtoi(*s, &v)) return absl::InternalError("peer sent a non-integer");
    return v;
  }

  std::unique_ptr<rlfleet::testing::Subprocess> process_;
};

}  // namespace

std::unique_ptr<Peer> StartProcessPeer(const std::vector<std::string>& argv) {
  auto process = std::make_unique<rlfleet::testing::Subprocess>();
  if (!process->Start(argv).ok()) return nullptr;
  return std::make_unique<ProcessPeer>(std::move(process));
}

int RunPeerCommandLoop(TransportPeer& peer) {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> a = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (a.empty()) continue;
    const std::string& cmd = a[0];
    std::string answer;
    if (cmd == "ADDRESS") {
      auto address = peer.Address();
      answer = address.ok() ? Answer(absl::OkStatus(), absl::BytesToHexString(*address)) : Answer(address.status());
    } else if (cmd == "CONNECT" && a.size() == 2) {
      answer = Answer(peer.ConnectTo(absl::HexStringToBytes(a[1])));
    } else if (cmd == "ALLOC") {
      answer = AnswerOr(peer.Allocate(U(a, 1), U(a, 2), U(a, 3) != 0));
    } else if (cmd == "DESCRIBE") {
      auto d = peer.Describe(static_cast<int>(U(a, 1)));
      answer = d.ok() ? Answer(absl::OkStatus(), absl::BytesToHexString(d->SerializeAsString())) : Answer(d.status());
    } else if (cmd == "VERIFY") {
      answer = Answer(peer.Verify(static_cast<int>(U(a, 1)), U(a, 2), U(a, 3), U(a, 4), U(a, 5)));
    } else if (cmd == "DEREG") {
      answer = Answer(peer.Deregister(static_cast<int>(U(a, 1))));
    } else if (cmd == "POSTRECV") {
      answer = AnswerOr(peer.PostRecv(U(a, 1), U(a, 2)));
    } else if (cmd == "WAITRECV") {
      answer = Answer(peer.WaitRecv(static_cast<int>(U(a, 1)), U(a, 2), U(a, 3), absl::Milliseconds(U(a, 4))));
    } else if (cmd == "POSTSEND") {
      answer = AnswerOr(peer.PostSend(U(a, 1), U(a, 2), U(a, 3)));
    } else if (cmd == "WAITSEND") {
      answer = Answer(peer.WaitSend(static_cast<int>(U(a, 1)), absl::Milliseconds(U(a, 2))));
    } else {
      answer = Answer(absl::InvalidArgumentError(absl::StrCat("unknown command `", line, "`")));
    }
    std::cout << answer << std::endl;
  }
  return 0;
}

}  // namespace rlfleet::transport::testing
