#include "libs/model/safetensors.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/huge_string.h"

namespace rlfleet::model {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;

int64_t DtypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return -1;
}

// A minimal JSON reader for the safetensors header: objects, arrays, strings (no
// escapes beyond \" and \\), integers.
class Json {
 public:
  explicit Json(const std::string& s) : s_(s) {}
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("safetensors header: ", what, " at byte ", i_));
  }
  void Ws() {
    while (i_ < s_.size() && absl::ascii_isspace(s_[i_])) ++i_;
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
    if (!absl::SimpleAtoi(absl::string_view(s_).substr(i_, j - i_), &v)) return Error("expected an integer");
    i_ = j;
    return v;
  }
  absl::StatusOr<std::vector<int64_t>> IntArray() {
    std::vector<int64_t> out;
    if (!Eat('[')) return Error("expected an array");
    if (Eat(']')) return out;
    do {
      auto v = Int();
      if (!v.ok()) return v.status();
      out.push_back(*v);
    } while (Eat(','));
    if (!Eat(']')) return Error("expected ]");
    return out;
  }
  // Skips any value (for __metadata__).
  absl::Status Skip() {
    Ws();
    if (i_ >= s_.size()) return Error("unexpected end");
    if (s_[i_] == '"') return String().status();
    if (s_[i_] == '{' || s_[i_] == '[') {
      const char open = s_[i_], close = open == '{' ? '}' : ']';
      ++i_;
      if (Eat(close)) return absl::OkStatus();
      do {
        if (open == '{') {
          if (auto k = String(); !k.ok()) return k.status();
          if (!Eat(':')) return Error("expected :");
        }
        if (auto s = Skip(); !s.ok()) return s;
      } while (Eat(','));
      if (!Eat(close)) return Error("unterminated container");
      return absl::OkStatus();
    }
    while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']') ++i_;
    return absl::OkStatus();
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

namespace {

template <typename Tensor>
std::string Serialize(const std::map<std::string, Tensor>& tensors, std::string reuse = std::string()) {
  std::string header = "{";
  uint64_t offset = 0;
  bool first = true;
  for (const auto& [name, t] : tensors) {
    absl::StrAppend(&header, first ? "" : ",", "\"", name, "\":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
                    offset + t.bytes.size(), "]}");
    offset += t.bytes.size();
    first = false;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';  // keeps the data 8-byte aligned
  std::string out = common::ReuseOrNewHugeString(std::move(reuse), 8 + header.size() + offset);
  const uint64_t n = header.size();
  char* at = out.data();
  std::memcpy(at, &n, 8);
  std::memcpy(at + 8, header.data(), header.size());
  at += 8 + header.size();
  for (const auto& [name, t] : tensors) {
    std::memcpy(at, t.bytes.data(), t.bytes.size());
    at += t.bytes.size();
  }
  return out;
}

}  // namespace

std::string SerializeSafetensors(const std::map<std::string, TensorBlob>& tensors) { return Serialize(tensors); }

std::string SerializeSafetensors(const std::map<std::string, TensorView>& tensors) { return Serialize(tensors); }

std::string SerializeSafetensors(const std::map<std::string, TensorView>& tensors, std::string reuse) {
  return Serialize(tensors, std::move(reuse));
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
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseSafetensors(buffer.str(), path);
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
  if (header_len > kMaxHeaderBytes || 8 + header_len > data.size()) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len, " does not fit the file"));
  }
  const std::string header = data.substr(8, header_len);
  const size_t base = 8 + header_len;
  Json json(header);
  std::map<std::string, TensorView> out;
  if (!json.Eat('{')) return json.Error("expected {");
  if (json.Eat('}')) return out;
  do {
    auto name = json.String();
    if (!name.ok()) return name.status();
    if (!json.Eat(':')) return json.Error("expected :");
    if (*name == "__metadata__") {
      if (auto s = json.Skip(); !s.ok()) return s;
      continue;
    }
    TensorView t;
    std::vector<int64_t> offsets;
    if (!json.Eat('{')) return json.Error("expected {");
    do {
      auto key = json.String();
      if (!key.ok()) return key.status();
      if (!json.Eat(':')) return json.Error("expected :");
      if (*key == "dtype") {
        auto v = json.String();
        if (!v.ok()) return v.status();
        t.dtype = *v;
      } else if (*key == "shape") {
        auto v = json.IntArray();
        if (!v.ok()) return v.status();
        t.shape = *v;
      } else if (*key == "data_offsets") {
        auto v = json.IntArray();
        if (!v.ok()) return v.status();
        offsets = *v;
      } else if (auto s = json.Skip(); !s.ok()) {
        return s;
      }
    } while (json.Eat(','));
    if (!json.Eat('}')) return json.Error("expected }");
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t elem = DtypeBytes(t.dtype);
    if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0] ||
        base + static_cast<uint64_t>(offsets[1]) > data.size() || elem < 0 ||
        offsets[1] - offsets[0] != numel * elem) {
      return absl::DataLossError(absl::StrCat(path, ": tensor `", *name, "` has bad offsets, dtype or shape"));
    }
    t.bytes = absl::string_view(data).substr(base + offsets[0], offsets[1] - offsets[0]);
    out[*name] = std::move(t);
  } while (json.Eat(','));
  if (!json.Eat('}')) return json.Error("expected }");
  return out;
}

}  // namespace rlfleet::model
