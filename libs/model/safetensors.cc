#include "libs/model/safetensors.h"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/files.h"

namespace rlfleet::model {
namespace {

int64_t DtypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return -1;
}

// A minimal JSON reader for the safetensors header: objects, arrays, strings (no
// escapes beyond \" and \\), integers. Bounded: containers nest at most
// kMaxSafetensorsJsonDepth deep (no recursion past it), integers are int64 or refused.
class Json {
 public:
  explicit Json(absl::string_view s) : s_(s) {}
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("safetensors header: ", what, " at byte ", i_));
  }
  void Ws() {
    while (i_ < s_.size() && absl::ascii_isspace(s_[i_])) ++i_;
  }
  bool AtEnd() {
    Ws();
    return i_ == s_.size();
  }
  bool Eat(char c) {
    Ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  absl::StatusOr<std::string> String() {
    if (!Eat('"')) return Error("expected a string");
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out.push_back(s_[i_++]);
    }
    if (i_ >= s_.size()) return Error("unterminated string");
    ++i_;
    return out;
  }
  absl::StatusOr<int64_t> Int() {
    Ws();
    size_t j = i_;
    while (j < s_.size() && (absl::ascii_isdigit(s_[j]) || s_[j] == '-')) ++j;
    int64_t v = 0;
    if (!absl::SimpleAtoi(s_.substr(i_, j - i_), &v)) return Error("expected an integer");
    i_ = j;
    return v;
  }
  // At most `max_items` integers.
  absl::StatusOr<std::vector<int64_t>> IntArray(size_t max_items) {
    std::vector<int64_t> out;
    if (!Eat('[')) return Error("expected an array");
    if (Eat(']')) return out;
    do {
      if (out.size() >= max_items) return Error(absl::StrCat("more than ", max_items, " integers"));
      auto v = Int();
      if (!v.ok()) return v.status();
      out.push_back(*v);
    } while (Eat(','));
    if (!Eat(']')) return Error("expected ]");
    return out;
  }
  // Skips any value (for __metadata__ and keys we do not read). Iterative: the open
  // containers are kept on an explicit stack of at most kMaxSafetensorsJsonDepth.
  absl::Status Skip() {
    std::string open;  // the closing bracket of each open container, innermost last
    do {
      // One value.
      Ws();
      if (i_ >= s_.size()) return Error("unexpected end");
      const char c = s_[i_];
      if (c == '"') {
        if (auto s = String(); !s.ok()) return s.status();
      } else if (c == '{' || c == '[') {
        if (open.size() >= kMaxSafetensorsJsonDepth) {
          return Error(absl::StrCat("containers nested deeper than ", kMaxSafetensorsJsonDepth));
        }
        ++i_;
        const char close = c == '{' ? '}' : ']';
        if (!Eat(close)) {
          open.push_back(close);
          if (close == '}' && !Key().ok()) return Error("expected a key");
          continue;  // the container's first value
        }
      } else {
        const size_t from = i_;
        while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']' && !absl::ascii_isspace(s_[i_])) {
          ++i_;
        }
        if (i_ == from) return Error("expected a value");
      }
      // After a value: the next one in the innermost container, or its close.
      while (!open.empty()) {
        if (Eat(',')) {
          if (open.back() == '}' && !Key().ok()) return Error("expected a key");
          break;
        }
        if (!Eat(open.back())) return Error("unterminated container");
        open.pop_back();
      }
    } while (!open.empty());
    return absl::OkStatus();
  }

 private:
  // `"key":`
  absl::Status Key() {
    if (auto k = String(); !k.ok()) return k.status();
    if (!Eat(':')) return Error("expected :");
    return absl::OkStatus();
  }

  absl::string_view s_;
  size_t i_ = 0;
};

}  // namespace

namespace {

// `s` as the header's reader reads a string back: `"` and `\` escaped.
std::string Quoted(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

template <typename Tensor>
common::HostBuffer Serialize(const std::map<std::string, Tensor>& tensors,
                             const std::shared_ptr<common::BufferPool>& pool) {
  std::vector<TensorSlot> slots;
  for (const auto& [name, t] : tensors) slots.push_back({name, t.dtype, t.shape, t.bytes.size()});
  char* at = nullptr;
  common::HostBuffer out = AllocateSafetensors(slots, pool, &at);
  for (const auto& [name, t] : tensors) {
    std::memcpy(at, t.bytes.data(), t.bytes.size());
    at += t.bytes.size();
  }
  return out;
}

}  // namespace

common::HostBuffer AllocateSafetensors(const std::vector<TensorSlot>& slots,
                                       const std::shared_ptr<common::BufferPool>& pool, char** data) {
  std::string header = "{";
  uint64_t offset = 0;
  bool first = true;
  for (const TensorSlot& t : slots) {
    absl::StrAppend(&header, first ? "" : ",", Quoted(t.name), ":{\"dtype\":", Quoted(t.dtype), ",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",", offset + t.bytes, "]}");
    offset += t.bytes;
    first = false;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';  // keeps the data 8-byte aligned
  common::HostBuffer out = common::HostBuffer::Allocate(pool, 8 + header.size() + offset);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  *data = out.data() + 8 + header.size();
  return out;
}

std::string SerializeSafetensors(const std::map<std::string, TensorBlob>& tensors) {
  return Serialize(tensors, nullptr).Release();
}

std::string SerializeSafetensors(const std::map<std::string, TensorView>& tensors) {
  return Serialize(tensors, nullptr).Release();
}

common::HostBuffer SerializeSafetensors(const std::map<std::string, TensorView>& tensors,
                                        const std::shared_ptr<common::BufferPool>& pool) {
  return Serialize(tensors, pool);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::map<std::string, TensorBlob>& tensors) {
  return WriteFileAtomically(path, SerializeSafetensors(tensors));
}

absl::StatusOr<std::map<std::string, TensorBlob>> ReadSafetensors(const std::string& path) {
  absl::StatusOr<std::string> bytes = common::ReadRegularFile("safetensors file", path, kMaxSafetensorsFileBytes);
  if (!bytes.ok()) return bytes.status();
  return ParseSafetensors(*bytes, path);
}

namespace {

// Blobs of `views`, their bytes copied or not.
absl::StatusOr<std::map<std::string, TensorBlob>> Blobs(absl::StatusOr<std::map<std::string, TensorView>> views,
                                                        bool with_bytes) {
  if (!views.ok()) return views.status();
  std::map<std::string, TensorBlob> out;
  for (auto& [name, v] : *views) {
    TensorBlob& b = out[name];
    b.dtype = v.dtype;
    b.shape = v.shape;
    if (with_bytes) b.bytes.assign(v.bytes.data(), v.bytes.size());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, TensorBlob>> ParseSafetensors(const std::string& data, const std::string& path) {
  return Blobs(ParseSafetensorsViews(data, path), /*with_bytes=*/true);
}

absl::StatusOr<std::map<std::string, TensorBlob>> ParseSafetensorsHeader(const std::string& data,
                                                                         const std::string& path) {
  return Blobs(ParseSafetensorsViews(data, path), /*with_bytes=*/false);
}

absl::StatusOr<std::map<std::string, TensorView>> ParseSafetensorsViews(const std::string& data,
                                                                        const std::string& path) {
  if (data.size() < 8) return absl::DataLossError(absl::StrCat(path, ": shorter than 8 bytes"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, data.data(), 8);
  if (header_len > kMaxSafetensorsHeaderBytes || header_len > data.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len, " does not fit the file"));
  }
  const absl::string_view header = absl::string_view(data).substr(8, header_len);
  const uint64_t base = 8 + header_len;
  const uint64_t data_bytes = data.size() - base;  // the bytes tensors may point into
  Json json(header);
  std::map<std::string, TensorView> out;
  auto bad = [&](const std::string& name, absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": tensor `", name, "`: ", why));
  };
  if (!json.Eat('{')) return json.Error("expected {");
  if (!json.Eat('}')) {
    bool metadata_seen = false;
    do {
      auto name = json.String();
      if (!name.ok()) return name.status();
      if (!json.Eat(':')) return json.Error("expected :");
      if (*name == "__metadata__") {
        if (metadata_seen) return json.Error("__metadata__ given twice");
        metadata_seen = true;
        if (auto s = json.Skip(); !s.ok()) return s;
        continue;
      }
      if (out.count(*name) != 0) return bad(*name, "given twice");
      if (out.size() >= kMaxSafetensorsTensors) {
        return absl::DataLossError(absl::StrCat(path, ": more than ", kMaxSafetensorsTensors, " tensors"));
      }
      TensorView t;
      std::vector<int64_t> offsets;
      bool has_dtype = false, has_shape = false, has_offsets = false;
      if (!json.Eat('{')) return json.Error("expected {");
      if (!json.Eat('}')) {
        do {
          auto key = json.String();
          if (!key.ok()) return key.status();
          if (!json.Eat(':')) return json.Error("expected :");
          if (*key == "dtype") {
            if (has_dtype) return bad(*name, "dtype given twice");
            has_dtype = true;
            auto v = json.String();
            if (!v.ok()) return v.status();
            t.dtype = *v;
          } else if (*key == "shape") {
            if (has_shape) return bad(*name, "shape given twice");
            has_shape = true;
            auto v = json.IntArray(kMaxSafetensorsRank);
            if (!v.ok()) return v.status();
            t.shape = *v;
          } else if (*key == "data_offsets") {
            if (has_offsets) return bad(*name, "data_offsets given twice");
            has_offsets = true;
            auto v = json.IntArray(2);
            if (!v.ok()) return v.status();
            offsets = *v;
          } else if (auto s = json.Skip(); !s.ok()) {
            return s;
          }
        } while (json.Eat(','));
        if (!json.Eat('}')) return json.Error("expected }");
      }
      if (!has_dtype || !has_shape || !has_offsets) return bad(*name, "needs dtype, shape and data_offsets");
      const int64_t elem = DtypeBytes(t.dtype);
      if (elem < 0) return bad(*name, absl::StrCat("unknown dtype `", t.dtype, "`"));
      // The byte size dtype x shape, every product checked: a shape whose product
      // overflows is refused, not wrapped into a small (matching) size.
      bool empty = false;
      for (int64_t d : t.shape) {
        if (d < 0) return bad(*name, absl::StrCat("negative dimension ", d));
        empty = empty || d == 0;
      }
      uint64_t bytes = empty ? 0 : static_cast<uint64_t>(elem);
      for (int64_t d : t.shape) {
        if (empty) break;
        if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
          return bad(*name, "dtype x shape overflows 64 bits");
        }
      }
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0] ||
          static_cast<uint64_t>(offsets[1]) > data_bytes) {
        return bad(*name, absl::StrCat("data_offsets outside the file's ", data_bytes, " data bytes"));
      }
      const uint64_t size = static_cast<uint64_t>(offsets[1] - offsets[0]);
      if (size != bytes) {
        return bad(*name, absl::StrCat("data_offsets span ", size, " bytes, dtype x shape needs ", bytes));
      }
      t.bytes = absl::string_view(data).substr(base + static_cast<uint64_t>(offsets[0]), size);
      out[*name] = std::move(t);
    } while (json.Eat(','));
    if (!json.Eat('}')) return json.Error("expected }");
  }
  if (!json.AtEnd()) return json.Error("bytes after the header's object");
  return out;
}

}  // namespace rlfleet::model
