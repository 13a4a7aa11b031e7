// The methods of strings and dicts that templates call, with Python's behaviour
// (str.strip with and without characters, split / rsplit with maxsplit, replace with a
// count, find and count in code points; dict.items / keys / values / get).
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/model/jinja_internal.h"
#include "libs/model/utf8.h"

namespace rlfleet::model::jinja {

namespace {

using Kind = Value::Kind;

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

}  // namespace

std::u32string DecodeUtf8(absl::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string EncodeUtf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) AppendUtf8(&out, c);
  return out;
}

namespace {

// Python's str.isspace for one code point.
bool PySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.strip / lstrip / rstrip, of whitespace or of the code points in `chars`.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::u32string cps = DecodeUtf8(s);
  const std::u32string set = chars != nullptr && chars->is_string() ? DecodeUtf8(chars->s) : std::u32string();
  auto strip = [&](char32_t c) {
    return chars != nullptr && chars->is_string() ? set.find(c) != set.npos : PySpace(c);
  };
  size_t begin = 0, end = cps.size();
  while (left && begin < end && strip(cps[begin])) ++begin;
  while (right && end > begin && strip(cps[end - 1])) --end;
  return EncodeUtf8(cps.substr(begin, end - begin));
}

// Runs of whitespace as words; with `maxsplit` >= 0 the rest after that many splits is
// one piece, kept as it is (Python: "  a b  c ".split(None, 1) == ["a", "b  c "]).
ValueList SplitWhitespace(std::u32string cps, int64_t maxsplit, bool from_right) {
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::u32string> words;
  size_t i = 0;
  while (true) {
    while (i < cps.size() && PySpace(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
      words.push_back(cps.substr(i));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !PySpace(cps[j])) ++j;
    words.push_back(cps.substr(i, j - i));
    i = j;
  }
  if (from_right) {
    std::reverse(words.begin(), words.end());
    for (auto& w : words) std::reverse(w.begin(), w.end());
  }
  ValueList out;
  for (const auto& w : words) out.push_back(Value::String(EncodeUtf8(w)));
  return out;
}

ValueList Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  if (!sep.is_string()) return SplitWhitespace(DecodeUtf8(s), maxsplit, from_right);
  ValueList out;
  std::vector<std::string> parts;
  if (!from_right) {
    size_t at = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t hit = s.find(sep.s, at);
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(at, hit - at));
      at = hit + sep.s.size();
    }
    parts.push_back(s.substr(at));
  } else {
    size_t end = s.size();
    std::vector<std::string> reversed;
    while (maxsplit < 0 || static_cast<int64_t>(reversed.size()) < maxsplit) {
      if (end < sep.s.size()) break;
      const size_t hit = s.rfind(sep.s, end - sep.s.size());
      if (hit == std::string::npos) break;
      reversed.push_back(s.substr(hit + sep.s.size(), end - hit - sep.s.size()));
      end = hit;
    }
    parts.push_back(s.substr(0, end));
    parts.insert(parts.end(), reversed.rbegin(), reversed.rend());
  }
  for (auto& p : parts) out.push_back(Value::String(std::move(p)));
  return out;
}

}  // namespace

absl::StatusOr<Value> Arg(const ValueList& args, const Kwargs& kwargs, size_t index, const std::string& name,
                          Value fallback) {
  for (const auto& [key, value] : kwargs) {
    if (key == name) return value;
  }
  return index < args.size() ? args[index] : fallback;
}

// A string's or dict's method, bound to it; undefined when `v` has none of that name.
Value Method(const Value& self, const std::string& name) {
  using Fn = std::function<absl::StatusOr<Value>(ValueList, Kwargs)>;
  auto bind = [&](Fn fn) { return Value::Function(name, std::move(fn)); };
  if (self.kind == Kind::kString) {
    const std::string s = self.s;
    if (name == "startswith" || name == "endswith") {
      const bool starts = name == "startswith";
      return bind([s, starts](ValueList args, Kwargs) -> absl::StatusOr<Value> {
        if (args.empty()) return TypeError("startswith/endswith takes a prefix");
        ValueList options = args[0].kind == Kind::kList ? *args[0].list : ValueList{args[0]};
        for (const auto& o : options) {
          if (!o.is_string()) return TypeError("startswith/endswith takes strings");
          if (starts ? absl::StartsWith(s, o.s) : absl::EndsWith(s, o.s)) return Value::Bool(true);
        }
        return Value::Bool(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool left = name != "rstrip", right = name != "lstrip";
      return bind([s, left, right](ValueList args, Kwargs) -> absl::StatusOr<Value> {
        return Value::String(Strip(s, args.empty() || args[0].kind == Kind::kNone ? nullptr : &args[0], left, right));
      });
    }
    if (name == "split" || name == "rsplit") {
      const bool right = name == "rsplit";
      return bind([s, right](ValueList args, Kwargs kwargs) -> absl::StatusOr<Value> {
        ASSIGN_OR_RETURN(Value sep, Arg(args, kwargs, 0, "sep", Value::None()));
        ASSIGN_OR_RETURN(Value max, Arg(args, kwargs, 1, "maxsplit", Value::Int(-1)));
        if (sep.is_string() && sep.s.empty()) return TypeError("empty separator");
        return Value::List(Split(s, sep, max.i, right));
      });
    }
    if (name == "replace") {
      return bind([s](ValueList args, Kwargs) -> absl::StatusOr<Value> {
        if (args.size() < 2 || !args[0].is_string() || !args[1].is_string())
          return TypeError("replace takes 2 strings");
        int64_t count = args.size() > 2 ? args[2].i : -1;
        std::string out;
        size_t at = 0;
        while (count != 0) {
          const size_t hit = args[0].s.empty() ? (at <= s.size() ? at : std::string::npos) : s.find(args[0].s, at);
          if (hit == std::string::npos) break;
          out += s.substr(at, hit - at) + args[1].s;
          if (args[0].s.empty()) {
            if (hit < s.size()) out += s[hit];
            at = hit + 1;
          } else {
            at = hit + args[0].s.size();
          }
          --count;
        }
        if (at <= s.size()) out += s.substr(at);
        return Value::String(out);
      });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return bind([s, name](ValueList, Kwargs) -> absl::StatusOr<Value> {
        return ApplyFilter(name, Value::String(s), {}, {});
      });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return bind([s, find](ValueList args, Kwargs) -> absl::StatusOr<Value> {
        if (args.empty() || !args[0].is_string()) return TypeError("find/count takes a string");
        if (find) {
          const size_t at = s.find(args[0].s);
          return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(DecodeUtf8(s.substr(0, at)).size()));
        }
        int64_t n = 0;
        for (size_t at = s.find(args[0].s); at != std::string::npos && !args[0].s.empty();
             at = s.find(args[0].s, at + args[0].s.size())) {
          ++n;
        }
        return Value::Int(n);
      });
    }
  }
  if (self.kind == Kind::kDict && !self.is_namespace) {
    const std::shared_ptr<ValueDict> dict = self.dict;
    if (name == "items" || name == "keys" || name == "values") {
      return bind([dict, name](ValueList, Kwargs) -> absl::StatusOr<Value> {
        ValueList out;
        for (const auto& [key, item] : dict->items) {
          if (name == "items") {
            Value pair = Value::List({Value::String(key), item});
            pair.tuple = true;
            out.push_back(pair);
          } else {
            out.push_back(name == "keys" ? Value::String(key) : item);
          }
        }
        return Value::List(std::move(out));
      });
    }
    if (name == "get") {
      return bind([dict](ValueList args, Kwargs) -> absl::StatusOr<Value> {
        if (args.empty()) return TypeError("get takes a key");
        const Value* found = args[0].is_string() ? dict->Find(args[0].s) : nullptr;
        return found != nullptr ? *found : args.size() > 1 ? args[1] : Value::None();
      });
    }
  }
  return Value::Undefined();
}

}  // namespace rlfleet::model::jinja
