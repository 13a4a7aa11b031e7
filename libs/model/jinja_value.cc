// Jinja values with Python's behaviour (truth, str, repr, ==, <, len, slicing,
// operators), transformers' tojson, the string / dict methods templates call, and
// Jinja's filters and tests.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/model/jinja_internal.h"

namespace rlfleet::model::jinja {

namespace {

using Kind = Value::Kind;

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

const char* TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return v.tuple ? "tuple" : "list";
    case Kind::kDict:
      return v.is_namespace ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "value";
}

// Python's float repr: the shortest digits that read back, positional for exponents in
// [-4, 16), else d.ddde+XX.
std::string FloatRepr(double f, bool json) {
  if (std::isnan(f)) return json ? "NaN" : "nan";
  if (std::isinf(f)) return json ? (f > 0 ? "Infinity" : "-Infinity") : (f > 0 ? "inf" : "-inf");
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*e", p - 1, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string text = buf;
  const bool negative = text[0] == '-';
  if (negative) text = text.substr(1);
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") +
          absl::StrFormat("e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return negative ? "-" + out : out;
}

std::string StringRepr(const std::string& s) {
  const char quote = absl::StrContains(s, '\'') && !absl::StrContains(s, '"') ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20) {
          out += absl::StrFormat("\\u%04x", u);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

absl::Status Dump(const Value& v, int indent, int level, bool sort_keys, const std::string& item_sep,
                  const std::string& key_sep, std::string* out) {
  if (level >= kMaxValueDepth) return TypeError(absl::StrCat("tojson: a value nested deeper than ", kMaxValueDepth));
  const std::string newline = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent) * (level + 1), ' ') : "";
  const std::string close = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent) * level, ' ') : "";
  switch (v.kind) {
    case Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      *out += v.b ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      *out += absl::StrCat(v.i);
      return absl::OkStatus();
    case Kind::kFloat:
      *out += FloatRepr(v.f, true);
      return absl::OkStatus();
    case Kind::kString:
      *out += JsonString(v.s);
      return absl::OkStatus();
    case Kind::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        *out += i == 0 ? newline : item_sep + newline;
        RETURN_IF_ERROR(Dump((*v.list)[i], indent, level + 1, sort_keys, item_sep, key_sep, out));
      }
      *out += close + "]";
      return absl::OkStatus();
    }
    case Kind::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      *out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        *out += (i == 0 ? newline : item_sep + newline) + JsonString(items[i]->first) + key_sep;
        RETURN_IF_ERROR(Dump(items[i]->second, indent, level + 1, sort_keys, item_sep, key_sep, out));
      }
      *out += close + "}";
      return absl::OkStatus();
    }
    default:
      return TypeError(absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
}

// Python's slice.indices for a sequence of `n` items.
absl::Status SliceIndices(const Value& start, const Value& stop, const Value& step, int64_t n, int64_t* from,
                          int64_t* to, int64_t* by) {
  auto as_int = [](const Value& v, int64_t* out) {
    if (v.kind == Kind::kNone || v.kind == Kind::kUndefined) return false;
    *out = v.kind == Kind::kBool ? v.b : v.i;
    return true;
  };
  for (const Value* v : {&start, &stop, &step}) {
    if (v->kind != Kind::kNone && v->kind != Kind::kUndefined && v->kind != Kind::kInt && v->kind != Kind::kBool) {
      return TypeError("slice indices must be integers or None");
    }
  }
  *by = 1;
  as_int(step, by);
  if (*by == 0) return TypeError("slice step cannot be zero");
  auto clamp = [&](int64_t i, bool is_stop) {
    if (i < 0) i += n;
    if (*by > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
    (void)is_stop;
  };
  int64_t i = 0;
  *from = as_int(start, &i) ? clamp(i, false) : (*by > 0 ? 0 : n - 1);
  *to = as_int(stop, &i) ? clamp(i, true) : (*by > 0 ? n : -1);
  return absl::OkStatus();
}

}  // namespace

// ---- Value.

const Value* ValueDict::Find(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::Undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}
Value Value::List(ValueList items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::Dict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>();
  return v;
}
Value Value::Function(std::string name, std::function<absl::StatusOr<Value>(ValueList, Kwargs)> fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

namespace {

Value FromJsonAt(const nlohmann::ordered_json& json, int depth) {
  if (depth > kMaxValueDepth) return Value::Undefined(absl::StrCat("a value nested deeper than ", kMaxValueDepth));
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return json.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? Value::Float(static_cast<double>(json.get<uint64_t>()))
                 : Value::Int(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& item : json) items.push_back(FromJsonAt(item, depth + 1));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::Dict();
      for (const auto& [key, item] : json.items()) v.dict->items.emplace_back(key, FromJsonAt(item, depth + 1));
      return v;
    }
    default:
      return Value::Undefined();
  }
}

bool NestsTooDeepAt(const Value& v, int depth, int limit, const ValueDict* self, int64_t* budget) {
  if (v.kind != Value::Kind::kList && v.kind != Value::Kind::kDict) return false;
  if (depth >= limit || --*budget < 0) return true;
  if (v.kind == Value::Kind::kList) {
    for (const Value& item : *v.list) {
      if (NestsTooDeepAt(item, depth + 1, limit, self, budget)) return true;
    }
    return false;
  }
  if (v.dict.get() == self) return true;
  for (const auto& [key, item] : v.dict->items) {
    if (NestsTooDeepAt(item, depth + 1, limit, self, budget)) return true;
  }
  return false;
}

}  // namespace

bool NestsTooDeep(const Value& v, int limit, const ValueDict* self, int64_t budget) {
  return NestsTooDeepAt(v, 0, limit, self, &budget);
}

Value Value::FromJson(const nlohmann::ordered_json& json) { return FromJsonAt(json, 0); }

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return v.is_namespace || !v.dict->items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

namespace {
std::string ReprAt(const Value& v, int depth);
}  // namespace

std::string Repr(const Value& v) { return ReprAt(v, 0); }

namespace {

std::string ReprAt(const Value& v, int depth) {
  if ((v.kind == Kind::kList || v.kind == Kind::kDict) && depth >= kMaxValueDepth) {
    return v.kind == Kind::kList ? "[...]" : "{...}";  // (as Python prints a list that holds itself)
  }
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(v.i);
    case Kind::kFloat:
      return FloatRepr(v.f, false);
    case Kind::kString:
      return StringRepr(v.s);
    case Kind::kList: {
      std::vector<std::string> items;
      for (const auto& item : *v.list) items.push_back(ReprAt(item, depth + 1));
      if (v.tuple) return "(" + absl::StrJoin(items, ", ") + (items.size() == 1 ? ",)" : ")");
      return "[" + absl::StrJoin(items, ", ") + "]";
    }
    case Kind::kDict: {
      std::vector<std::string> items;
      for (const auto& [key, item] : v.dict->items) items.push_back(StringRepr(key) + ": " + ReprAt(item, depth + 1));
      if (v.is_namespace) return "<Namespace " + absl::StrJoin(items, ", ") + ">";
      return "{" + absl::StrJoin(items, ", ") + "}";
    }
    case Kind::kCallable:
      return "<function " + v.fn->name + ">";
  }
  return "";
}

}  // namespace

std::string ToString(const Value& v) { return v.kind == Kind::kString ? v.s : Repr(v); }

absl::StatusOr<std::string> ToJson(const Value& v, int indent, bool sort_keys, const std::string* item_separator,
                                   const std::string* key_separator) {
  const std::string item_sep = item_separator != nullptr ? *item_separator : indent >= 0 ? "," : ", ";
  const std::string key_sep = key_separator != nullptr ? *key_separator : ": ";
  std::string out;
  RETURN_IF_ERROR(Dump(v, indent, 0, sort_keys, item_sep, key_sep, &out));
  return out;
}

namespace {
bool EqualAt(const Value& a, const Value& b, int depth);
}  // namespace

bool Equal(const Value& a, const Value& b) { return EqualAt(a, b, 0); }

namespace {

bool EqualAt(const Value& a, const Value& b, int depth) {
  if (depth >= kMaxValueDepth) return false;  // (too deep to compare: a value that holds itself)
  if ((a.is_number() || a.kind == Kind::kBool) && (b.is_number() || b.kind == Kind::kBool)) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.number() == b.number();
    return (a.kind == Kind::kBool ? a.b : a.i) == (b.kind == Kind::kBool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!EqualAt((*a.list)[i], (*b.list)[i], depth + 1)) return false;
      }
      return true;
    case Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, item] : a.dict->items) {
        const Value* other = b.dict->Find(key);
        if (other == nullptr || !EqualAt(item, *other, depth + 1)) return false;
      }
      return true;
    case Kind::kCallable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if ((a.is_number() || a.kind == Kind::kBool) && (b.is_number() || b.kind == Kind::kBool)) {
    return a.number() < b.number();
  }
  if (a.is_string() && b.is_string()) return DecodeUtf8(a.s) < DecodeUtf8(b.s);
  return TypeError(absl::StrCat("'<' not supported between instances of '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(DecodeUtf8(v.s).size());
    case Kind::kList:
      return static_cast<int64_t>(v.list->size());
    case Kind::kDict:
      return static_cast<int64_t>(v.dict->items.size());
    default:
      return TypeError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return ValueList{};
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& item : v.dict->items) keys.push_back(Value::String(item.first));
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (char32_t c : DecodeUtf8(v.s)) chars.push_back(Value::String(EncodeUtf8(std::u32string(1, c))));
      return chars;
    }
    default:
      return TypeError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

Value GetAttr(const Value& v, const std::string& name) {
  if (v.kind == Kind::kDict && v.is_namespace) {
    const Value* found = v.dict->Find(name);
    return found != nullptr ? *found : Value::Undefined(absl::StrCat("'Namespace' has no attribute '", name, "'"));
  }
  Value method = Method(v, name);
  if (method.defined()) return method;
  if (v.kind == Kind::kDict) {
    const Value* found = v.dict->Find(name);
    if (found != nullptr) return *found;
  }
  return Value::Undefined(absl::StrCat("'", TypeName(v), " object' has no attribute '", name, "'"));
}

Value GetItem(const Value& v, const Value& key) {
  if (v.kind == Kind::kDict && key.is_string()) {
    const Value* found = v.dict->Find(key.s);
    if (found != nullptr) return *found;
    if (!v.is_namespace) {
      Value method = Method(v, key.s);
      if (method.defined()) return method;
    }
    return Value::Undefined(absl::StrCat("'", TypeName(v), " object' has no attribute '", key.s, "'"));
  }
  if ((v.kind == Kind::kList || v.kind == Kind::kString) && (key.kind == Kind::kInt || key.kind == Kind::kBool)) {
    int64_t i = key.kind == Kind::kBool ? key.b : key.i;
    if (v.kind == Kind::kList) {
      const auto n = static_cast<int64_t>(v.list->size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return (*v.list)[i];
    } else {
      const std::u32string cps = DecodeUtf8(v.s);
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::String(EncodeUtf8(cps.substr(i, 1)));
    }
    return Value::Undefined(absl::StrCat(TypeName(v), " index out of range"));
  }
  if (key.is_string()) return GetAttr(v, key.s);
  return Value::Undefined(absl::StrCat("'", TypeName(v), " object' has no item ", Repr(key)));
}

absl::StatusOr<Value> Slice(const Value& v, const Value& start, const Value& stop, const Value& step) {
  if (v.kind != Kind::kList && v.kind != Kind::kString) {
    return TypeError(absl::StrCat("'", TypeName(v), "' object is not subscriptable"));
  }
  const std::u32string cps = v.kind == Kind::kString ? DecodeUtf8(v.s) : std::u32string();
  const auto n = static_cast<int64_t>(v.kind == Kind::kString ? cps.size() : v.list->size());
  int64_t from = 0, to = 0, by = 1;
  RETURN_IF_ERROR(SliceIndices(start, stop, step, n, &from, &to, &by));
  ValueList items;
  std::u32string chars;
  for (int64_t i = from; by > 0 ? i < to : i > to; i += by) {
    if (v.kind == Kind::kString) {
      chars.push_back(cps[i]);
    } else {
      items.push_back((*v.list)[i]);
    }
  }
  if (v.kind == Kind::kString) return Value::String(EncodeUtf8(chars));
  Value out = Value::List(std::move(items));
  out.tuple = v.tuple;
  return out;
}

absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b) {
  // Strings and lists a template builds stay within bounds (a doubling loop would not).
  constexpr size_t kMaxBytes = 64 << 20, kMaxItems = 1 << 20;
  if (op == "~" || op == "+" || op == "*") {
    const int64_t count = b.kind == Kind::kBool ? b.b : b.i;
    // (checked before multiplying: a count near 2^63 must not wrap the product)
    const size_t times = op == "*" && (b.kind == Kind::kInt || b.kind == Kind::kBool) && count > 0
                             ? static_cast<size_t>(std::min<int64_t>(count, kMaxBytes + 1))
                             : 1;
    const size_t bytes = op == "~"       ? ToString(a).size() + ToString(b).size()
                         : a.is_string() ? (a.s.empty() ? 0 : a.s.size() * times) + (b.is_string() ? b.s.size() : 0)
                                         : 0;
    const size_t items =
        a.kind == Kind::kList ? a.list->size() * times + (b.kind == Kind::kList ? b.list->size() : 0) : 0;
    if (bytes > kMaxBytes || items > kMaxItems) {
      return TypeError(
          absl::StrCat("a value over the template's bounds (", kMaxBytes >> 20, " MiB, ", kMaxItems, " items)"));
    }
  }
  if (op == "~") return Value::String(ToString(a) + ToString(b));
  if (op == "in") {
    if (b.kind == Kind::kString) {
      if (!a.is_string()) return TypeError("'in <string>' requires string as left operand");
      return Value::Bool(absl::StrContains(b.s, a.s));
    }
    if (b.kind == Kind::kDict) return Value::Bool(a.is_string() && b.dict->Find(a.s) != nullptr);
    ASSIGN_OR_RETURN(ValueList items, Iterate(b));
    for (const auto& item : items) {
      if (Equal(item, a)) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  const bool numbers = (a.is_number() || a.kind == Kind::kBool) && (b.is_number() || b.kind == Kind::kBool);
  const bool ints = numbers && a.kind != Kind::kFloat && b.kind != Kind::kFloat;
  const int64_t ai = a.kind == Kind::kBool ? a.b : a.i, bi = b.kind == Kind::kBool ? b.b : b.i;
  int64_t r = 0;
  const auto overflow = [&]() -> absl::StatusOr<Value> {
    return TypeError(absl::StrCat("integer overflow: ", ai, " ", op, " ", bi, " is outside 64 bits"));
  };
  if (op == "+") {
    if (ints) return __builtin_add_overflow(ai, bi, &r) ? overflow() : Value::Int(r);
    if (numbers) return Value::Float(a.number() + b.number());
    if (a.is_string() && b.is_string()) return Value::String(a.s + b.s);
    if (a.kind == Kind::kList && b.kind == Kind::kList) {
      ValueList items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::List(std::move(items));
    }
  } else if (op == "-") {
    if (ints) return __builtin_sub_overflow(ai, bi, &r) ? overflow() : Value::Int(r);
    if (numbers) return Value::Float(a.number() - b.number());
  } else if (op == "*") {
    if (ints) return __builtin_mul_overflow(ai, bi, &r) ? overflow() : Value::Int(r);
    if (numbers) return Value::Float(a.number() * b.number());
    if (a.is_string() && (b.kind == Kind::kInt || b.kind == Kind::kBool)) {
      std::string out;
      for (int64_t k = 0; k < bi; ++k) out += a.s;
      return Value::String(out);
    }
  } else if (op == "/" || op == "//" || op == "%") {
    if (numbers) {
      if (b.number() == 0) return TypeError("division by zero");
      if (op == "/") return Value::Float(a.number() / b.number());
      if (ints) {
        if (ai == std::numeric_limits<int64_t>::min() && bi == -1) {  // (the one quotient past 64 bits: a trap)
          if (op == "%") return Value::Int(0);
          return overflow();
        }
        int64_t q = ai / bi, m = ai % bi;
        if (m != 0 && ((m < 0) != (bi < 0))) --q, m += bi;
        return Value::Int(op == "//" ? q : m);
      }
      const double q = std::floor(a.number() / b.number());
      return Value::Float(op == "//" ? q : a.number() - q * b.number());
    }
  } else if (op == "**") {
    if (ints && bi >= 0) {  // by squaring: 64 multiplications at most, each checked
      int64_t result = 1, base = ai;
      for (int64_t e = bi; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
          if (ai == 0 || ai == 1 || ai == -1) break;  // (the result cannot grow: not an overflow)
          return overflow();
        }
      }
      if (ai == 0) return Value::Int(bi == 0 ? 1 : 0);
      if (ai == 1) return Value::Int(1);
      if (ai == -1) return Value::Int(bi % 2 == 0 ? 1 : -1);
      return Value::Int(result);
    }
    if (numbers) return Value::Float(std::pow(a.number(), b.number()));
  }
  if (!a.defined() || !b.defined()) {
    return TypeError(!a.defined() && !a.s.empty() ? a.s : !b.s.empty() ? b.s : "an undefined value in arithmetic");
  }
  return TypeError(
      absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '", TypeName(b), "'"));
}

}  // namespace rlfleet::model::jinja
