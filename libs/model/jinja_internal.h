// The inside of libs/model/jinja.h: values, tokens, the syntax tree, and the parts that
// work on them (jinja_lex.cc splits a template into pieces and tokens, jinja_parse.cc
// reads them into a tree, jinja_value.cc holds the values' Python behaviour,
// jinja_methods.cc their string and dict methods, jinja_filters.cc Jinja's filters and
// tests, jinja_render.cc walks the tree). Only those files include this header.
#ifndef RLFLEET_LIBS_MODEL_JINJA_INTERNAL_H_
#define RLFLEET_LIBS_MODEL_JINJA_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlfleet::model::jinja {

struct Value;
using ValueList = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

// A dict keeps its keys in insertion order (Python's dicts do; tojson and items() show it).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(absl::string_view key) const;
  void Set(const std::string& key, Value value);
};

struct Callable {
  std::string name;
  std::function<absl::StatusOr<Value>(ValueList args, Kwargs kwargs)> fn;
};

// A Jinja value with Python's semantics. Lists and dicts are shared by reference, as in
// Python (a namespace() is a dict whose attributes `set` may assign).
struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // a string's UTF-8, or an undefined value's name (for errors)
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;
  std::shared_ptr<Callable> fn;
  bool tuple = false;  // a list written as a tuple (repr uses parentheses)
  bool is_namespace = false;

  static Value Undefined(std::string name = "");
  static Value None();
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Float(double v);
  static Value String(std::string v);
  static Value List(ValueList items = {});
  static Value Dict();
  static Value Function(std::string name, std::function<absl::StatusOr<Value>(ValueList, Kwargs)> fn);
  static Value FromJson(const nlohmann::ordered_json& json);

  bool defined() const { return kind != Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool is_string() const { return kind == Kind::kString; }
  double number() const { return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i); }
};

// How deeply lists and dicts may nest in a template's values. Values built deeper (a
// loop wrapping a list in a list, a namespace that holds itself) are refused; what
// walks values (repr, tojson, ==) stops there too, so no input recurses without bound.
inline constexpr int kMaxValueDepth = 200;

// Whether `v` nests deeper than `limit` levels, or holds `self` (a dict: an assignment
// that would make a cycle), looking at no more than `budget` values (past it: true).
bool NestsTooDeep(const Value& v, int limit, const ValueDict* self = nullptr, int64_t budget = 1'000'000);

// Python's truth value.
bool Truthy(const Value& v);
// str(v) as Jinja prints it ("" for undefined, "None", "True", Python reprs inside lists).
std::string ToString(const Value& v);
// repr(v).
std::string Repr(const Value& v);
// transformers' tojson: json.dumps(v, ensure_ascii=False, indent, separators, sort_keys).
absl::StatusOr<std::string> ToJson(const Value& v, int indent, bool sort_keys, const std::string* item_separator,
                                   const std::string* key_separator);
// Python's ==.
bool Equal(const Value& a, const Value& b);
// Python's <, for numbers and strings; INVALID_ARGUMENT for other kinds.
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// Python's len() (code points of a string); INVALID_ARGUMENT for values without one.
absl::StatusOr<int64_t> Length(const Value& v);
// The items a for loop walks: a list's, a dict's keys, a string's characters; nothing for
// undefined.
absl::StatusOr<ValueList> Iterate(const Value& v);
// `v.name`: a dict's key, a string's / dict's / list's method bound to it, a namespace's
// attribute; undefined when absent.
Value GetAttr(const Value& v, const std::string& name);
// `v[key]`: negative list and string indices count from the end; undefined when absent.
Value GetItem(const Value& v, const Value& key);
// `v[start:stop:step]` of a list or string (absent bounds are none).
absl::StatusOr<Value> Slice(const Value& v, const Value& start, const Value& stop, const Value& step);
// A binary operator: + - * / // % ** ~ and `in`.
absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b);
// The filter `name` applied to `v`; INVALID_ARGUMENT naming a filter not supported.
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const ValueList& args, const Kwargs& kwargs);
// The test `name` (`v is name(args)`); INVALID_ARGUMENT naming a test not supported.
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const ValueList& args);

// A string's code points, and back (Python's strings are sequences of code points).
std::u32string DecodeUtf8(absl::string_view s);
std::string EncodeUtf8(const std::u32string& s);
// A string's or dict's method bound to it (jinja_methods.cc); undefined when `self`
// has none of that name.
Value Method(const Value& self, const std::string& name);
// A call's argument by keyword or position, else `fallback`.
absl::StatusOr<Value> Arg(const ValueList& args, const Kwargs& kwargs, size_t index, const std::string& name,
                          Value fallback);

// ---- Reading (jinja_lex.cc).

// One piece of a template: text, an expression to print ({{ }}) or a statement ({% %}).
struct Piece {
  enum class Kind { kText, kPrint, kStatement };
  Kind kind;
  std::string text;  // the text, or the tag's inside
  int line;
};

// The template's pieces, as jinja2/lexer.py splits them with trim_blocks and
// lstrip_blocks on and keep_trailing_newline off.
absl::StatusOr<std::vector<Piece>> SplitTemplate(absl::string_view source, const std::string& name);

struct Token {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd };
  Kind kind;
  std::string text;  // a name, an operator, a string's value
  int64_t i = 0;
  double f = 0;
};

// The tokens inside a tag, ending with kEnd.
absl::StatusOr<std::vector<Token>> Tokenize(const std::string& s);

// ---- The syntax tree.

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args (a tuple when value.tuple)
    kDict,     // args as key, value, key, value...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null for absent)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name in {"-", "+", "not"} of args[0]
    kBinary,   // args[0] name args[1]: arithmetic, ~, in, not in, and, or
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (chained, as Python)
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind = Kind::kLiteral;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<std::string> ops;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  int line = 0;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue, kMacro };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;                          // kText
  std::unique_ptr<Expr> expr;                // kOutput; kFor's iterable; kSet's value
  std::vector<std::unique_ptr<Expr>> conds;  // kIf: one per branch; kFor: its `if` filter (or empty)
  std::vector<Body> bodies;                  // kIf: one per cond, then else; kFor: body, else; kSet: a block
  std::vector<std::string> targets;          // kFor / kSet: names to bind; kMacro: its name
  std::string attr;                          // kSet: `set ns.attr = ...` (targets[0] is ns)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> params;  // kMacro (null: no default)
};

// Reads a template (transformers' settings: trim_blocks, lstrip_blocks, a trailing
// newline dropped). Errors name `name` and the line.
absl::StatusOr<Body> ParseTemplate(absl::string_view source, const std::string& name);

}  // namespace rlfleet::model::jinja

#endif  // RLFLEET_LIBS_MODEL_JINJA_INTERNAL_H_
