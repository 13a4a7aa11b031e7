// Reading and writing safetensors files (the ecosystem's weight format: an 8-byte
// little-endian header length, a JSON header of name -> {dtype, shape, data_offsets},
// then raw little-endian tensor bytes). No libtorch here: tensors are byte blobs.
#ifndef RLFLEET_LIBS_MODEL_SAFETENSORS_H_
#define RLFLEET_LIBS_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/common/host_buffer.h"

namespace rlfleet::model {

// Bounds on what a parser of untrusted safetensors bytes accepts (anything past them is
// DATA_LOSS): the JSON header's length (the format's own 100 MB), how deep containers
// nest inside it (__metadata__ or unknown keys), how many tensors it names, how many
// dimensions a shape has, and the size of a file ReadSafetensors reads.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100 << 20;
inline constexpr size_t kMaxSafetensorsJsonDepth = 64;
inline constexpr size_t kMaxSafetensorsTensors = 1 << 20;
inline constexpr size_t kMaxSafetensorsRank = 16;
inline constexpr uint64_t kMaxSafetensorsFileBytes = uint64_t{1} << 40;

struct TensorBlob {
  std::string dtype = "F32";  // safetensors dtype name: F32, BF16, F16, I64, I32, U8, ...
  std::vector<int64_t> shape;
  std::string bytes;
};

// A tensor's bytes where they already are (valid while serialising).
struct TensorView {
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  absl::string_view bytes;
};

// The safetensors image of `tensors` (header, then the data 8-byte aligned), in one
// huge-page backed string (each tensor's bytes copied once, into place).
std::string SerializeSafetensors(const std::map<std::string, TensorBlob>& tensors);
std::string SerializeSafetensors(const std::map<std::string, TensorView>& tensors);
// The same in memory from `pool` (when it holds a buffer large enough; back there when
// the image is dropped): a publisher writing version after version writes into memory
// faulted in already instead of a fresh buffer each time.
common::HostBuffer SerializeSafetensors(const std::map<std::string, TensorView>& tensors,
                                        const std::shared_ptr<common::BufferPool>& pool);
// A tensor of an image whose data the caller writes (AllocateSafetensors).
struct TensorSlot {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // dtype size x shape
};
// An image of `tensors` in the order listed (the format allows any order: readers go
// by each tensor's data_offsets), in memory from `pool`, its data region left for the
// caller to fill: `*data` points at it, the slots' bytes back to back. A publisher
// whose parameters are one buffer in that order writes the data with one copy.
common::HostBuffer AllocateSafetensors(const std::vector<TensorSlot>& tensors,
                                       const std::shared_ptr<common::BufferPool>& pool, char** data);
// At least the size of the f32 safetensors image of a model with `parameters`
// parameters (their bytes and a header of at most 1 MiB): memory to fault in for one.
inline uint64_t F32ImageBytesBound(uint64_t parameters) { return parameters * 4 + (uint64_t{1} << 20); }
// Writes bytes to `path` atomically (temporary file + rename): a crash never leaves a
// half file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);
// Writes atomically (temporary file + rename): a crash never leaves a half file.
absl::Status WriteSafetensors(const std::string& path, const std::map<std::string, TensorBlob>& tensors);

// NOT_FOUND for a missing file; INVALID_ARGUMENT for one that is not a regular file (a
// FIFO or /dev/zero is refused before a byte is read) or is larger than
// kMaxSafetensorsFileBytes; DATA_LOSS naming what is wrong for a malformed one (header
// length, JSON, nesting deeper than kMaxSafetensorsJsonDepth, a tensor named twice or
// missing dtype / shape / data_offsets, an unknown dtype, a negative dimension, a
// dtype x shape product that overflows, offsets outside the file, size not matching
// dtype x shape, bytes after the header's object other than padding spaces).
absl::StatusOr<std::map<std::string, TensorBlob>> ReadSafetensors(const std::string& path);
// The same over bytes already in memory (`name` names them in errors).
absl::StatusOr<std::map<std::string, TensorBlob>> ParseSafetensors(const std::string& bytes, const std::string& name);
// The same, each tensor's bytes a view into `bytes` (nothing copied).
absl::StatusOr<std::map<std::string, TensorView>> ParseSafetensorsViews(const std::string& bytes,
                                                                        const std::string& name);
// The same checks, the tensors' dtypes and shapes only (their bytes left empty).
absl::StatusOr<std::map<std::string, TensorBlob>> ParseSafetensorsHeader(const std::string& bytes,
                                                                         const std::string& name);

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_SAFETENSORS_H_
