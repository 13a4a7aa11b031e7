// Rendering a parsed template: a walk over the syntax tree with Jinja's scoping (a for
// loop's body and a macro's body are scopes of their own, fresh on every iteration;
// `if` is not; a namespace() is shared by reference, which is how templates carry state
// out of a loop).
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/common/status_macros.h"
#include "libs/model/jinja.h"
#include "libs/model/jinja_internal.h"

namespace rlfleet::model {

struct JinjaTemplate::Tree {
  jinja::Body body;
};

namespace jinja {
namespace {

// Bounds that keep a template from running away: its output, range() and macro depth.
constexpr size_t kMaxOutputBytes = 64 << 20;
constexpr int64_t kMaxRange = 250'000;
constexpr int kMaxMacroDepth = 16;
constexpr int64_t kMaxSteps = 250'000;                       // statements run plus loop iterations
constexpr absl::Duration kMaxRenderTime = absl::Seconds(2);  // wall clock, checked every 256 steps

class Renderer {
 public:
  Renderer(const std::string& name, absl::Time now) : name_(name), now_(now) { scopes_.emplace_back(); }

  void Define(const std::string& key, Value value) { scopes_.front()[key] = std::move(value); }

  void DefineBuiltins() {
    Define("raise_exception", Value::Function("raise_exception", [this](ValueList args, Kwargs) {
             return absl::StatusOr<Value>(absl::InvalidArgumentError(
                 absl::StrCat("chat template ", name_, " raised: ", args.empty() ? std::string() : ToString(args[0]))));
           }));
    Define("strftime_now", Value::Function("strftime_now", [this](ValueList args, Kwargs) -> absl::StatusOr<Value> {
             if (args.empty() || !args[0].is_string()) return absl::InvalidArgumentError("strftime_now takes a format");
             return Value::String(absl::FormatTime(args[0].s, now_, absl::LocalTimeZone()));
           }));
    Define("namespace", Value::Function("namespace", [](ValueList args, Kwargs kwargs) -> absl::StatusOr<Value> {
             Value ns = Value::Dict();
             ns.is_namespace = true;
             for (const auto& arg : args) {
               if (arg.kind != Value::Kind::kDict) return absl::InvalidArgumentError("namespace() takes a mapping");
               for (const auto& [k, v] : arg.dict->items) ns.dict->Set(k, v);
             }
             for (auto& [k, v] : kwargs) ns.dict->Set(k, std::move(v));
             return ns;
           }));
    Define("dict", Value::Function("dict", [](ValueList, Kwargs kwargs) -> absl::StatusOr<Value> {
             Value d = Value::Dict();
             for (auto& [k, v] : kwargs) d.dict->Set(k, std::move(v));
             return d;
           }));
    Define("range", Value::Function("range", [](ValueList args, Kwargs) -> absl::StatusOr<Value> {
             int64_t start = 0, stop = 0, step = 1;
             for (const auto& a : args) {
               if (a.kind != Value::Kind::kInt) return absl::InvalidArgumentError("range() takes integers");
             }
             if (args.size() == 1) {
               stop = args[0].i;
             } else if (args.size() == 2 || args.size() == 3) {
               start = args[0].i;
               stop = args[1].i;
               if (args.size() == 3) step = args[2].i;
             } else {
               return absl::InvalidArgumentError("range() takes 1 to 3 arguments");
             }
             if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
             ValueList items;
             for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
               if (static_cast<int64_t>(items.size()) >= kMaxRange) {
                 return absl::InvalidArgumentError(absl::StrCat("range() longer than ", kMaxRange));
               }
               items.push_back(Value::Int(i));
               if (__builtin_add_overflow(i, step, &i)) break;  // (past 64 bits is past `stop`)
             }
             return Value::List(std::move(items));
           }));
  }

  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const auto& stmt : body) {
      ASSIGN_OR_RETURN(Flow flow, ExecOne(*stmt, out));
      if (flow != Flow::kNormal) return flow;
      if (out->size() > kMaxOutputBytes) {
        return Error(stmt->line, absl::StrCat("the output is over ", kMaxOutputBytes >> 20, " MiB"));
      }
    }
    return Flow::kNormal;
  }

 private:
  using Scope = absl::flat_hash_map<std::string, Value>;

  absl::Status Error(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template ", name_, " line ", line, ": ", what));
  }
  // Errors from values and filters get the line; raise_exception's message stays as is.
  absl::Status AtLine(int line, const absl::Status& status) const {
    if (status.ok() || absl::StartsWith(status.message(), "chat template ")) return status;
    return Error(line, status.message());
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  absl::Status Bind(const std::vector<std::string>& targets, const Value& value, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = value;
      return absl::OkStatus();
    }
    auto items = Iterate(value);
    if (!items.ok()) return AtLine(line, items.status());
    if (items->size() != targets.size()) {
      return Error(line, absl::StrCat("cannot unpack ", items->size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = (*items)[i];
    return absl::OkStatus();
  }

  absl::Status Step(int line) {
    if (++steps_ > kMaxSteps) return Error(line, absl::StrCat("the template runs over ", kMaxSteps, " steps"));
    if (steps_ % 256 == 0 && absl::Now() > deadline_) {
      return Error(line, absl::StrCat("the template runs over ", absl::FormatDuration(kMaxRenderTime)));
    }
    return absl::OkStatus();
  }

  static std::string TooDeep() {
    return absl::StrCat("a list or dict nested deeper than ", kMaxValueDepth, " (or too large to check)");
  }

  absl::StatusOr<Flow> ExecOne(const Stmt& stmt, std::string* out) {
    RETURN_IF_ERROR(Step(stmt.line));
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        *out += stmt.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*stmt.expr));
        *out += ToString(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < stmt.bodies.size(); ++i) {
          bool take = i >= stmt.conds.size();
          if (!take) {
            ASSIGN_OR_RETURN(Value cond, Eval(*stmt.conds[i]));
            take = Truthy(cond);
          }
          if (take) return Exec(stmt.bodies[i], out);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        return ExecFor(stmt, out);
      case Stmt::Kind::kSet: {
        Value value;
        if (stmt.expr != nullptr) {
          ASSIGN_OR_RETURN(value, Eval(*stmt.expr));
        } else {
          std::string block;
          RETURN_IF_ERROR(Exec(stmt.bodies[0], &block).status());
          value = Value::String(std::move(block));
        }
        if (stmt.attr.empty()) {
          RETURN_IF_ERROR(Bind(stmt.targets, value, stmt.line));
          return Flow::kNormal;
        }
        Value ns = Lookup(stmt.targets[0]);
        if (ns.kind != Value::Kind::kDict || !ns.is_namespace) {
          return Error(stmt.line, absl::StrCat("cannot assign attribute on non-namespace object ", stmt.targets[0]));
        }
        // (a namespace that would hold itself, or values nested without bound, are refused:
        // printing or freeing them would recurse without end)
        if (NestsTooDeep(value, kMaxValueDepth - 1, ns.dict.get())) {
          return Error(stmt.line,
                       absl::StrCat("set ", stmt.targets[0], ".", stmt.attr,
                                    ": the value holds the namespace itself or nests deeper than ", kMaxValueDepth));
        }
        ns.dict->Set(stmt.attr, std::move(value));
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kMacro: {
        const Stmt* macro = &stmt;
        scopes_.back()[stmt.targets[0]] =
            Value::Function(stmt.targets[0], [this, macro](ValueList args, Kwargs kwargs) -> absl::StatusOr<Value> {
              return CallMacro(*macro, std::move(args), std::move(kwargs));
            });
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& stmt, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr));
    auto all = Iterate(iterable);
    if (!all.ok()) return AtLine(stmt.line, all.status());
    ValueList items;
    for (auto& item : *all) {
      if (!stmt.conds.empty()) {
        RETURN_IF_ERROR(Step(stmt.line));
        scopes_.emplace_back();
        absl::Status bound = Bind(stmt.targets, item, stmt.line);
        auto keep = bound.ok() ? Eval(*stmt.conds[0]) : absl::StatusOr<Value>(bound);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (!Truthy(*keep)) continue;
      }
      items.push_back(std::move(item));
    }
    if (items.empty()) {
      if (stmt.bodies.size() > 1) return Exec(stmt.bodies[1], out);
      return Flow::kNormal;
    }
    const auto n = static_cast<int64_t>(items.size());
    // One `loop` object whose fields each iteration rewrites in place.
    Value loop = Value::Dict();
    loop.is_namespace = true;  // attributes only
    for (const char* field :
         {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem", "cycle"}) {
      loop.dict->items.emplace_back(field, Value());
    }
    auto& fields = loop.dict->items;
    const std::weak_ptr<ValueDict> weak = loop.dict;
    fields[6].second = Value::Int(n);
    fields[9].second = Value::Function("cycle", [weak](ValueList args, Kwargs) -> absl::StatusOr<Value> {
      auto dict = weak.lock();
      if (args.empty() || dict == nullptr) return absl::InvalidArgumentError("loop.cycle() takes values");
      return args[dict->items[1].second.i % static_cast<int64_t>(args.size())];
    });
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(Step(stmt.line));
      fields[0].second = Value::Int(i + 1);
      fields[1].second = Value::Int(i);
      fields[2].second = Value::Int(n - i);
      fields[3].second = Value::Int(n - i - 1);
      fields[4].second = Value::Bool(i == 0);
      fields[5].second = Value::Bool(i == n - 1);
      fields[7].second = i > 0 ? items[i - 1] : Value::Undefined("there is no previous item");
      fields[8].second = i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item");
      scopes_.emplace_back();
      scopes_.back()["loop"] = loop;
      absl::Status bound = Bind(stmt.targets, items[i], stmt.line);
      auto flow = bound.ok() ? Exec(stmt.bodies[0], out) : absl::StatusOr<Flow>(bound);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> CallMacro(const Stmt& macro, ValueList args, Kwargs kwargs) {
    if (depth_ >= kMaxMacroDepth) return Error(macro.line, "macros nest too deep");
    if (args.size() > macro.params.size()) {
      return Error(macro.line, absl::StrCat("macro ", macro.targets[0], " takes ", macro.params.size(), " arguments"));
    }
    Scope scope;
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [param, fallback] = macro.params[i];
      Value value = i < args.size() ? args[i] : Value::Undefined(absl::StrCat("'", param, "' is undefined"));
      for (auto& [key, v] : kwargs) {
        if (key == param) value = v;
      }
      if (!value.defined() && fallback != nullptr) {
        ASSIGN_OR_RETURN(value, Eval(*fallback));
      }
      scope[param] = std::move(value);
    }
    ++depth_;
    scopes_.push_back(std::move(scope));
    std::string out;
    auto flow = Exec(macro.bodies[0], &out);
    scopes_.pop_back();
    --depth_;
    if (!flow.ok()) return flow.status();
    return Value::String(std::move(out));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        for (const auto& arg : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*arg));
          if (NestsTooDeep(v, kMaxValueDepth - 1)) return Error(e.line, TooDeep());
          items.push_back(std::move(v));
        }
        Value list = Value::List(std::move(items));
        list.tuple = e.value.tuple;
        return list;
      }
      case Expr::Kind::kDict: {
        Value dict = Value::Dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
          if (!key.is_string()) return Error(e.line, "dict keys must be strings here");
          ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
          if (NestsTooDeep(value, kMaxValueDepth - 1)) return Error(e.line, TooDeep());
          dict.dict->Set(key.s, std::move(value));
        }
        return dict;
      }
      case Expr::Kind::kAttr:
      case Expr::Kind::kItem: {
        ASSIGN_OR_RETURN(Value base, Eval(*e.args[0]));
        if (!base.defined()) return Error(e.line, base.s.empty() ? "an undefined value has no attributes" : base.s);
        if (e.kind == Expr::Kind::kAttr) return GetAttr(base, e.name);
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(base, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value base, Eval(*e.args[0]));
        if (!base.defined()) return Error(e.line, base.s.empty() ? "an undefined value has no items" : base.s);
        Value bounds[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1] != nullptr) {
            ASSIGN_OR_RETURN(bounds[i], Eval(*e.args[i + 1]));
          }
        }
        return Wrap(e.line, Slice(base, bounds[0], bounds[1], bounds[2]));
      }
      case Expr::Kind::kCall:
      case Expr::Kind::kFilter:
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        ValueList args;
        for (size_t i = 1; i < e.args.size(); ++i) {
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
          args.push_back(std::move(v));
        }
        Kwargs kwargs;
        for (const auto& [key, arg] : e.kwargs) {
          ASSIGN_OR_RETURN(Value v, Eval(*arg));
          kwargs.emplace_back(key, std::move(v));
        }
        if (e.kind == Expr::Kind::kFilter) return Wrap(e.line, ApplyFilter(e.name, subject, args, kwargs));
        if (e.kind == Expr::Kind::kTest) {
          auto passed = ApplyTest(e.name, subject, args);
          if (!passed.ok()) return AtLine(e.line, passed.status());
          return Value::Bool(*passed != e.negated);
        }
        if (subject.kind != Value::Kind::kCallable) {
          return Error(e.line, subject.defined()
                                   ? absl::StrCat("'", Repr(subject), "' is not callable")
                                   : (subject.s.empty() ? "an undefined value is not callable" : subject.s));
        }
        return Wrap(e.line, subject.fn->fn(std::move(args), std::move(kwargs)));
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        if (e.name == "not") return Value::Bool(!Truthy(x));
        if (x.kind == Value::Kind::kInt || x.kind == Value::Kind::kBool) {
          const int64_t i = x.kind == Value::Kind::kBool ? x.b : x.i;
          return Value::Int(e.name == "-" ? -i : i);
        }
        if (x.kind == Value::Kind::kFloat) return Value::Float(e.name == "-" ? -x.f : x.f);
        return Error(e.line, absl::StrCat("bad operand type for unary ", e.name));
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (e.name == "and") return Truthy(a) ? Eval(*e.args[1]) : a;
        if (e.name == "or") return Truthy(a) ? a : Eval(*e.args[1]);
        ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return Wrap(e.line, BinaryOp(e.name, a, b));
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          ASSIGN_OR_RETURN(bool holds, Compare(e.ops[i], left, right, e.line));
          if (!holds) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value cond, Eval(*e.args[1]));
        if (Truthy(cond)) return Eval(*e.args[0]);
        if (e.args[2] == nullptr) return Value::Undefined("the inline if had no else");
        return Eval(*e.args[2]);
      }
    }
    return Error(e.line, "unknown expression");
  }

  absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in" || op == "not in") {
      auto in = BinaryOp("in", a, b);
      if (!in.ok()) return AtLine(line, in.status());
      return in->b == (op == "in");
    }
    auto less = op == "<" || op == ">=" ? Less(a, b) : Less(b, a);
    if (!less.ok()) return AtLine(line, less.status());
    if (op == "<" || op == ">") return *less;
    return !*less;
  }

  absl::StatusOr<Value> Wrap(int line, absl::StatusOr<Value> v) const {
    if (!v.ok()) return AtLine(line, v.status());
    return v;
  }

  const std::string& name_;
  const absl::Time now_;
  const absl::Time deadline_ = absl::Now() + kMaxRenderTime;
  std::vector<Scope> scopes_;
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace
}  // namespace jinja

JinjaTemplate::JinjaTemplate(std::string name, std::unique_ptr<Tree> tree)
    : name_(std::move(name)), tree_(std::move(tree)) {}

JinjaTemplate::~JinjaTemplate() = default;

absl::StatusOr<std::unique_ptr<JinjaTemplate>> JinjaTemplate::Parse(absl::string_view source, std::string name) {
  auto tree = std::make_unique<Tree>();
  ASSIGN_OR_RETURN(tree->body, jinja::ParseTemplate(source, name));
  return std::unique_ptr<JinjaTemplate>(new JinjaTemplate(std::move(name), std::move(tree)));
}

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& variables, absl::Time now) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template ", name_, ": the variables must be a JSON object"));
  }
  jinja::Renderer renderer(name_, now);
  renderer.DefineBuiltins();
  for (const auto& [key, value] : variables.items()) renderer.Define(key, jinja::Value::FromJson(value));
  std::string out;
  RETURN_IF_ERROR(renderer.Exec(tree_->body, &out).status());
  return out;
}

}  // namespace rlfleet::model
