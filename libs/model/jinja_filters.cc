// Jinja's filters (`x | name(args)`) and tests (`x is name(args)`) that chat templates
// use, with transformers' tojson. Anything else is refused by name.
#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/model/jinja_internal.h"

namespace rlfleet::model::jinja {

namespace {

using Kind = Value::Kind;

absl::StatusOr<std::string> StringArg(const ValueList& args, const Kwargs& kwargs, size_t index,
                                      const std::string& name, const std::string& filter) {
  ASSIGN_OR_RETURN(Value v, Arg(args, kwargs, index, name, Value::Undefined()));
  if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat("the filter ", filter, " takes a string ", name));
  return v.s;
}

// A string with each word's first letter upper case and the rest lower (ASCII letters).
std::string Title(const std::string& s) {
  std::string out = s;
  bool word_start = true;
  for (char& c : out) {
    const bool letter = absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (letter) c = word_start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
    word_start = !letter;
  }
  return out;
}

// `attribute` may be dotted ("function.name") or an index, as Jinja's make_attrgetter.
Value Attribute(const Value& v, const std::string& attribute) {
  Value out = v;
  size_t at = 0;
  while (at <= attribute.size()) {
    const size_t dot = attribute.find('.', at);
    const std::string part = attribute.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    int64_t index = 0;
    out = absl::SimpleAtoi(part, &index) ? GetItem(out, Value::Int(index)) : GetItem(out, Value::String(part));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return out;
}

// select / reject / selectattr / rejectattr: the items whose test (or truth) is `keep`.
absl::StatusOr<Value> Select(const Value& v, const ValueList& args, bool by_attribute, bool keep) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.empty() || !args[0].is_string()) return absl::InvalidArgumentError("selectattr takes an attribute name");
    attribute = args[next++].s;
  }
  std::string test;
  if (next < args.size()) {
    if (!args[next].is_string()) return absl::InvalidArgumentError("select takes a test name");
    test = args[next++].s;
  }
  const ValueList test_args(args.begin() + static_cast<std::ptrdiff_t>(next), args.end());
  ValueList out;
  for (const auto& item : items) {
    const Value subject = by_attribute ? Attribute(item, attribute) : item;
    bool passed = Truthy(subject);
    if (!test.empty()) {
      ASSIGN_OR_RETURN(passed, ApplyTest(test, subject, test_args));
    }
    if (passed == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const ValueList& args,
                                  const Kwargs& kwargs) {
  if (name == "length" || name == "count") {
    ASSIGN_OR_RETURN(int64_t n, Length(v));
    return Value::Int(n);
  }
  if (name == "tojson") {
    ASSIGN_OR_RETURN(Value indent, Arg(args, kwargs, 0, "indent", Value::None()));
    ASSIGN_OR_RETURN(Value sort_keys, Arg(args, kwargs, 3, "sort_keys", Value::Bool(false)));
    ASSIGN_OR_RETURN(Value separators, Arg(args, kwargs, 2, "separators", Value::None()));
    ASSIGN_OR_RETURN(Value ensure_ascii, Arg(args, kwargs, 1, "ensure_ascii", Value::Bool(false)));
    if (Truthy(ensure_ascii)) return absl::InvalidArgumentError("tojson(ensure_ascii=true) is not supported");
    if (indent.kind != Kind::kNone && indent.kind != Kind::kInt) {
      return absl::InvalidArgumentError("tojson's indent must be an integer");
    }
    const std::string* item_sep = nullptr;
    const std::string* key_sep = nullptr;
    if (separators.kind == Kind::kList) {
      if (separators.list->size() != 2 || !(*separators.list)[0].is_string() || !(*separators.list)[1].is_string()) {
        return absl::InvalidArgumentError("tojson's separators must be two strings");
      }
      item_sep = &(*separators.list)[0].s;
      key_sep = &(*separators.list)[1].s;
    }
    ASSIGN_OR_RETURN(std::string json, ToJson(v, indent.kind == Kind::kInt ? static_cast<int>(indent.i) : -1,
                                              Truthy(sort_keys), item_sep, key_sep));
    return Value::String(std::move(json));
  }
  if (name == "string") return Value::String(ToString(v));
  if (name == "trim") {
    ASSIGN_OR_RETURN(Value chars, Arg(args, kwargs, 0, "chars", Value::None()));
    Value strip = GetAttr(Value::String(ToString(v)), "strip");
    return strip.fn->fn(chars.kind == Kind::kNone ? ValueList{} : ValueList{chars}, {});
  }
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize") {
    std::string s = ToString(v);
    if (name == "lower") return Value::String(absl::AsciiStrToLower(s));
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(s));
    if (name == "title") return Value::String(Title(s));
    s = absl::AsciiStrToLower(s);
    if (!s.empty()) s[0] = absl::ascii_toupper(s[0]);
    return Value::String(s);
  }
  if (name == "safe") return v;
  if (name == "default" || name == "d") {
    ASSIGN_OR_RETURN(Value fallback, Arg(args, kwargs, 0, "default_value", Value::String("")));
    ASSIGN_OR_RETURN(Value boolean, Arg(args, kwargs, 1, "boolean", Value::Bool(false)));
    return !v.defined() || (Truthy(boolean) && !Truthy(v)) ? fallback : v;
  }
  if (name == "items") {
    if (!v.defined()) return Value::List();
    if (v.kind != Kind::kDict) return absl::InvalidArgumentError("the filter items takes a mapping");
    return GetAttr(v, "items").fn->fn({}, {});
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.empty()) return Value::Undefined("no first/last item of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) return Slice(v, Value::None(), Value::None(), Value::Int(-1));
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(Value sep, Arg(args, kwargs, 0, "d", Value::String("")));
    ASSIGN_OR_RETURN(Value attribute, Arg(args, kwargs, 1, "attribute", Value::None()));
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += ToString(sep);
      out += ToString(attribute.is_string() ? Attribute(items[i], attribute.s) : items[i]);
    }
    return Value::String(out);
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string old, StringArg(args, kwargs, 0, "old", name));
    ASSIGN_OR_RETURN(std::string replacement, StringArg(args, kwargs, 1, "new", name));
    ValueList call_args = {Value::String(old), Value::String(replacement)};
    if (args.size() > 2) call_args.push_back(args[2]);
    return GetAttr(Value::String(ToString(v)), "replace").fn->fn(call_args, {});
  }
  if (name == "int" || name == "float" || name == "abs" || name == "round") {
    if (name == "abs") {
      if (v.kind == Kind::kInt) return Value::Int(v.i < 0 ? -v.i : v.i);
      if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
      return absl::InvalidArgumentError("the filter abs takes a number");
    }
    if (name == "round") {
      ASSIGN_OR_RETURN(Value precision, Arg(args, kwargs, 0, "precision", Value::Int(0)));
      const double scale = std::pow(10.0, static_cast<double>(precision.i));
      return Value::Float(std::round(v.number() * scale) / scale);
    }
    double number = 0;
    bool ok = v.is_number() || v.kind == Kind::kBool;
    if (ok) number = v.number();
    if (v.is_string()) ok = absl::SimpleAtod(absl::StripAsciiWhitespace(v.s), &number);
    if (!ok) return Arg(args, kwargs, 0, "default", name == "int" ? Value::Int(0) : Value::Float(0));
    return name == "int" ? Value::Int(static_cast<int64_t>(number)) : Value::Float(number);
  }
  if (name == "map") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    ASSIGN_OR_RETURN(Value attribute, Arg({}, kwargs, 0, "attribute", Value::None()));
    ValueList out;
    for (const auto& item : items) {
      if (attribute.is_string()) {
        out.push_back(Attribute(item, attribute.s));
      } else if (!args.empty() && args[0].is_string()) {
        const ValueList rest(args.begin() + 1, args.end());
        ASSIGN_OR_RETURN(Value mapped, ApplyFilter(args[0].s, item, rest, {}));
        out.push_back(mapped);
      } else {
        return absl::InvalidArgumentError("map takes a filter name or attribute=");
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject") return Select(v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return Select(v, args, true, name == "selectattr");
  if (name == "unique") {
    ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    ValueList out;
    for (const auto& item : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& seen) { return Equal(seen, item); })) {
        out.push_back(item);
      }
    }
    return Value::List(std::move(out));
  }
  return absl::InvalidArgumentError(absl::StrCat("the Jinja filter `", name, "` is not supported in chat templates"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const ValueList& args) {
  auto arg = [&]() -> absl::StatusOr<Value> {
    if (args.empty()) return absl::InvalidArgumentError(absl::StrCat("the test ", name, " takes an argument"));
    return args[0];
  };
  if (name == "defined") return v.defined();
  if (name == "undefined") return !v.defined();
  if (name == "none") return v.kind == Kind::kNone;
  if (name == "string") return v.is_string();
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true" || name == "false") return v.kind == Kind::kBool && v.b == (name == "true");
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "number") return v.is_number() || v.kind == Kind::kBool;
  if (name == "mapping") return v.kind == Kind::kDict && !v.is_namespace;
  if (name == "iterable") {
    return v.kind == Kind::kUndefined || v.kind == Kind::kString || v.kind == Kind::kList ||
           (v.kind == Kind::kDict && !v.is_namespace);
  }
  if (name == "sequence") return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict;
  if (name == "callable") return v.kind == Kind::kCallable;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return v.s == (name == "lower" ? absl::AsciiStrToLower(v.s) : absl::AsciiStrToUpper(v.s));
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != Kind::kInt) return absl::InvalidArgumentError(absl::StrCat("the test ", name, " takes an integer"));
    if (name != "divisibleby") return (v.i % 2 != 0) == (name == "odd");
    ASSIGN_OR_RETURN(Value d, arg());
    if (d.kind != Kind::kInt || d.i == 0) return absl::InvalidArgumentError("divisibleby takes a nonzero integer");
    return v.i % d.i == 0;
  }
  if (name == "eq" || name == "equalto" || name == "sameas" || name == "ne") {
    ASSIGN_OR_RETURN(Value other, arg());
    return Equal(v, other) == (name != "ne");
  }
  if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
    ASSIGN_OR_RETURN(Value other, arg());
    ASSIGN_OR_RETURN(bool less, Less(name[0] == 'l' ? v : other, name[0] == 'l' ? other : v));
    return less || (name[1] == 'e' && Equal(v, other));
  }
  if (name == "in") {
    ASSIGN_OR_RETURN(Value other, arg());
    ASSIGN_OR_RETURN(Value in, BinaryOp("in", v, other));
    return in.b;
  }
  return absl::InvalidArgumentError(absl::StrCat("the Jinja test `", name, "` is not supported in chat templates"));
}

}  // namespace rlfleet::model::jinja
