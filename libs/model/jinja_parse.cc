// Reading a Jinja template into the syntax tree of jinja_internal.h: the pieces and
// tokens of jinja_lex.cc, statements nested into blocks, and each tag's expression by
// recursive descent in Jinja's operator precedence (jinja2/parser.py).
#include <cctype>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/model/jinja_internal.h"

namespace rlfleet::model::jinja {

namespace {

// The features a template may ask for that this reader refuses, by name.
const std::set<std::string>& Unsupported() {
  static const auto* tags = new std::set<std::string>{"raw",           "endraw",   "filter", "endfilter", "call",
                                                      "endcall",       "include",  "import", "from",      "extends",
                                                      "block",         "endblock", "with",   "endwith",   "autoescape",
                                                      "endautoescape", "do",       "trans",  "endtrans",  "pluralize"};
  return *tags;
}

// Bounds that keep the tree shallow enough to walk (and free) by recursion: blocks and
// expressions nested, and the tokens of one tag (a left-deep chain like 1+1+1+...).
constexpr int kMaxNesting = 64;
constexpr size_t kMaxTokensPerTag = 1024;

// Counts one level of nesting while it lives.
class Nesting {
 public:
  explicit Nesting(int* depth) : depth_(depth) { ++*depth_; }
  ~Nesting() { --*depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  bool too_deep() const { return *depth_ > kMaxNesting; }

 private:
  int* depth_;
};

class Parser {
 public:
  Parser(std::vector<Piece> pieces, std::string name) : pieces_(std::move(pieces)), name_(std::move(name)) {}

  absl::StatusOr<Body> Parse() {
    Body body;
    std::string ended;
    RETURN_IF_ERROR(ParseBody(&body, {}, &ended));
    return body;
  }

 private:
  absl::Status Error(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template ", name_, " line ", line, ": ", what));
  }

  // Statements up to one whose keyword is in `ends` (left in tokens_ for the caller, its
  // keyword in *ended), or to the template's end when `ends` is empty.
  absl::Status ParseBody(Body* out, const std::set<std::string>& ends, std::string* ended) {
    while (next_ < pieces_.size()) {
      const Piece& piece = pieces_[next_++];
      line_ = piece.line;
      if (piece.kind == Piece::Kind::kText) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kText;
        stmt->text = piece.text;
        stmt->line = piece.line;
        out->push_back(std::move(stmt));
        continue;
      }
      auto tokens = Tokenize(piece.text);
      if (!tokens.ok()) return Error(piece.line, tokens.status().message());
      if (tokens->size() > kMaxTokensPerTag) {
        return Error(piece.line, absl::StrCat("a tag of more than ", kMaxTokensPerTag, " tokens"));
      }
      tokens_ = *std::move(tokens);
      at_ = 0;
      if (piece.kind == Piece::Kind::kPrint) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kOutput;
        stmt->line = piece.line;
        ASSIGN_OR_RETURN(stmt->expr, ParseExpression(true));
        RETURN_IF_ERROR(ExpectEnd());
        out->push_back(std::move(stmt));
        continue;
      }
      if (Peek().kind != Token::Kind::kName) return Error(piece.line, "a {% %} tag without a statement name");
      const std::string keyword = Next().text;
      if (ends.count(keyword) != 0) {
        *ended = keyword;
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(auto stmt, ParseStatement(keyword, piece.line));
      if (stmt != nullptr) out->push_back(std::move(stmt));
    }
    if (!ends.empty()) {
      return Error(line_, absl::StrCat("the template ends inside a block; expected {% ",
                                       absl::StrJoin(ends, " %} or {% "), " %}"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement(const std::string& keyword, int line) {
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return Error(line_, absl::StrCat("nested more than ", kMaxNesting, " deep"));
    auto stmt = std::make_unique<Stmt>();
    stmt->line = line;
    std::string ended;
    if (keyword == "if") {
      stmt->kind = Stmt::Kind::kIf;
      while (true) {
        ASSIGN_OR_RETURN(auto cond, ParseExpression(true));
        RETURN_IF_ERROR(ExpectEnd());
        stmt->conds.push_back(std::move(cond));
        stmt->bodies.emplace_back();
        RETURN_IF_ERROR(ParseBody(&stmt->bodies.back(), {"elif", "else", "endif"}, &ended));
        if (ended != "elif") break;
      }
      if (ended == "else") {
        RETURN_IF_ERROR(ExpectEnd());
        stmt->bodies.emplace_back();
        RETURN_IF_ERROR(ParseBody(&stmt->bodies.back(), {"endif"}, &ended));
      }
      RETURN_IF_ERROR(ExpectEnd());
      return stmt;
    }
    if (keyword == "for") {
      stmt->kind = Stmt::Kind::kFor;
      ASSIGN_OR_RETURN(stmt->targets, ParseTargets());
      if (!Accept("in")) return Error(line, "expected `in` in a for statement");
      ASSIGN_OR_RETURN(stmt->expr, ParseExpression(false));
      if (Accept("if")) {
        ASSIGN_OR_RETURN(auto cond, ParseExpression(false));
        stmt->conds.push_back(std::move(cond));
      }
      if (Accept("recursive")) return Error(line, "recursive for loops are not supported");
      RETURN_IF_ERROR(ExpectEnd());
      stmt->bodies.emplace_back();
      RETURN_IF_ERROR(ParseBody(&stmt->bodies.back(), {"else", "endfor"}, &ended));
      if (ended == "else") {
        RETURN_IF_ERROR(ExpectEnd());
        stmt->bodies.emplace_back();
        RETURN_IF_ERROR(ParseBody(&stmt->bodies.back(), {"endfor"}, &ended));
      }
      RETURN_IF_ERROR(ExpectEnd());
      return stmt;
    }
    if (keyword == "set") {
      stmt->kind = Stmt::Kind::kSet;
      if (Peek().kind != Token::Kind::kName) return Error(line, "expected a name after set");
      if (Peek(1).text == ".") {
        stmt->targets.push_back(Next().text);
        Next();
        if (Peek().kind != Token::Kind::kName) return Error(line, "expected an attribute name in set");
        stmt->attr = Next().text;
      } else {
        ASSIGN_OR_RETURN(stmt->targets, ParseTargets());
      }
      if (AcceptOp("=")) {
        ASSIGN_OR_RETURN(stmt->expr, ParseExpression(true));
        RETURN_IF_ERROR(ExpectEnd());
        return stmt;
      }
      RETURN_IF_ERROR(ExpectEnd());  // a block set: {% set x %}...{% endset %}
      stmt->bodies.emplace_back();
      RETURN_IF_ERROR(ParseBody(&stmt->bodies.back(), {"endset"}, &ended));
      RETURN_IF_ERROR(ExpectEnd());
      return stmt;
    }
    if (keyword == "break" || keyword == "continue") {
      stmt->kind = keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      RETURN_IF_ERROR(ExpectEnd());
      return stmt;
    }
    if (keyword == "macro") {
      stmt->kind = Stmt::Kind::kMacro;
      if (Peek().kind != Token::Kind::kName) return Error(line, "expected the macro's name");
      stmt->targets.push_back(Next().text);
      if (!AcceptOp("(")) return Error(line, "expected ( after the macro's name");
      while (!AcceptOp(")")) {
        if (Peek().kind != Token::Kind::kName) return Error(line, "expected a macro parameter name");
        std::string param = Next().text;
        std::unique_ptr<Expr> def;
        if (AcceptOp("=")) {
          ASSIGN_OR_RETURN(def, ParseExpression(true));
        }
        stmt->params.emplace_back(std::move(param), std::move(def));
        if (!AcceptOp(",") && Peek().text != ")") return Error(line, "expected , or ) in the macro's parameters");
      }
      RETURN_IF_ERROR(ExpectEnd());
      stmt->bodies.emplace_back();
      RETURN_IF_ERROR(ParseBody(&stmt->bodies.back(), {"endmacro"}, &ended));
      RETURN_IF_ERROR(ExpectEnd());
      return stmt;
    }
    if (keyword == "generation") {  // transformers' assistant-mask marker: the text is the same
      RETURN_IF_ERROR(ExpectEnd());
      Body body;
      RETURN_IF_ERROR(ParseBody(&body, {"endgeneration"}, &ended));
      RETURN_IF_ERROR(ExpectEnd());
      stmt->kind = Stmt::Kind::kIf;
      auto always = std::make_unique<Expr>();
      always->value = Value::Bool(true);
      stmt->conds.push_back(std::move(always));
      stmt->bodies.push_back(std::move(body));
      return stmt;
    }
    if (Unsupported().count(keyword) != 0) {
      return Error(line, absl::StrCat("the Jinja statement `", keyword, "` is not supported in chat templates"));
    }
    return Error(line, absl::StrCat("unknown statement `", keyword, "`"));
  }

  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = AcceptOp("(");
    do {
      if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a variable name");
      names.push_back(Next().text);
    } while (AcceptOp(","));
    if (paren && !AcceptOp(")")) return Error(line_, "expected )");
    return names;
  }

  // ---- Expressions, in jinja2/parser.py's precedence.

  using ExprOr = absl::StatusOr<std::unique_ptr<Expr>>;

  std::unique_ptr<Expr> Make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }

  ExprOr ParseExpression(bool with_condexpr) {
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return Error(line_, absl::StrCat("nested more than ", kMaxNesting, " deep"));
    ASSIGN_OR_RETURN(auto e, ParseOr());
    if (!with_condexpr) return e;
    while (Accept("if")) {
      auto cond = Make(Expr::Kind::kCond);
      cond->args.push_back(std::move(e));
      ASSIGN_OR_RETURN(auto test, ParseOr());
      cond->args.push_back(std::move(test));
      std::unique_ptr<Expr> otherwise;
      if (Accept("else")) {
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      cond->args.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  ExprOr Binary(std::string op, std::unique_ptr<Expr> a, std::unique_ptr<Expr> b) {
    auto e = Make(Expr::Kind::kBinary);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprOr ParseOr() {
    ASSIGN_OR_RETURN(auto e, ParseAnd());
    while (Accept("or")) {
      ASSIGN_OR_RETURN(auto b, ParseAnd());
      ASSIGN_OR_RETURN(e, Binary("or", std::move(e), std::move(b)));
    }
    return e;
  }

  ExprOr ParseAnd() {
    ASSIGN_OR_RETURN(auto e, ParseNot());
    while (Accept("and")) {
      ASSIGN_OR_RETURN(auto b, ParseNot());
      ASSIGN_OR_RETURN(e, Binary("and", std::move(e), std::move(b)));
    }
    return e;
  }

  ExprOr ParseNot() {
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return Error(line_, absl::StrCat("nested more than ", kMaxNesting, " deep"));
    if (Accept("not")) {
      auto e = Make(Expr::Kind::kUnary);
      e->name = "not";
      ASSIGN_OR_RETURN(auto x, ParseNot());
      e->args.push_back(std::move(x));
      return e;
    }
    return ParseCompare();
  }

  ExprOr ParseCompare() {
    ASSIGN_OR_RETURN(auto first, ParseMath1());
    std::unique_ptr<Expr> chain;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.kind == Token::Kind::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = Next().text;
      } else if (Accept("in")) {
        op = "in";
      } else if (t.kind == Token::Kind::kName && t.text == "not" && Peek(1).text == "in" &&
                 Peek(1).kind == Token::Kind::kName) {
        Next();
        Next();
        op = "not in";
      } else {
        break;
      }
      if (chain == nullptr) {
        chain = Make(Expr::Kind::kCompare);
        chain->args.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      ASSIGN_OR_RETURN(auto b, ParseMath1());
      chain->args.push_back(std::move(b));
    }
    if (chain != nullptr) return chain;
    return first;
  }

  ExprOr ParseMath1() {
    ASSIGN_OR_RETURN(auto e, ParseConcat());
    while (Peek().kind == Token::Kind::kOp && (Peek().text == "+" || Peek().text == "-")) {
      std::string op = Next().text;
      ASSIGN_OR_RETURN(auto b, ParseConcat());
      ASSIGN_OR_RETURN(e, Binary(op, std::move(e), std::move(b)));
    }
    return e;
  }

  ExprOr ParseConcat() {
    ASSIGN_OR_RETURN(auto e, ParseMath2());
    while (AcceptOp("~")) {
      ASSIGN_OR_RETURN(auto b, ParseMath2());
      ASSIGN_OR_RETURN(e, Binary("~", std::move(e), std::move(b)));
    }
    return e;
  }

  ExprOr ParseMath2() {
    ASSIGN_OR_RETURN(auto e, ParsePow());
    while (Peek().kind == Token::Kind::kOp &&
           (Peek().text == "*" || Peek().text == "/" || Peek().text == "//" || Peek().text == "%")) {
      std::string op = Next().text;
      ASSIGN_OR_RETURN(auto b, ParsePow());
      ASSIGN_OR_RETURN(e, Binary(op, std::move(e), std::move(b)));
    }
    return e;
  }

  ExprOr ParsePow() {
    ASSIGN_OR_RETURN(auto e, ParseUnary(true));
    while (AcceptOp("**")) {
      ASSIGN_OR_RETURN(auto b, ParseUnary(true));
      ASSIGN_OR_RETURN(e, Binary("**", std::move(e), std::move(b)));
    }
    return e;
  }

  ExprOr ParseUnary(bool with_filter) {
    Nesting nesting(&depth_);
    if (nesting.too_deep()) return Error(line_, absl::StrCat("nested more than ", kMaxNesting, " deep"));
    std::unique_ptr<Expr> e;
    if (Peek().kind == Token::Kind::kOp && (Peek().text == "-" || Peek().text == "+")) {
      e = Make(Expr::Kind::kUnary);
      e->name = Next().text;
      ASSIGN_OR_RETURN(auto x, ParseUnary(false));
      e->args.push_back(std::move(x));
    } else {
      ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    if (with_filter) {
      ASSIGN_OR_RETURN(e, ParseFilters(std::move(e)));
    }
    return e;
  }

  ExprOr ParsePrimary() {
    const Token t = Next();
    switch (t.kind) {
      case Token::Kind::kName: {
        auto e = Make(Expr::Kind::kLiteral);
        if (t.text == "true" || t.text == "True") {
          e->value = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::kString: {
        std::string s = t.text;
        while (Peek().kind == Token::Kind::kString) s += Next().text;
        auto e = Make(Expr::Kind::kLiteral);
        e->value = Value::String(std::move(s));
        return e;
      }
      case Token::Kind::kInt: {
        auto e = Make(Expr::Kind::kLiteral);
        e->value = Value::Int(t.i);
        return e;
      }
      case Token::Kind::kFloat: {
        auto e = Make(Expr::Kind::kLiteral);
        e->value = Value::Float(t.f);
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          if (AcceptOp(")")) {
            auto e = Make(Expr::Kind::kList);
            e->value.tuple = true;
            return e;
          }
          ASSIGN_OR_RETURN(auto first, ParseExpression(true));
          if (AcceptOp(")")) return first;
          auto e = Make(Expr::Kind::kList);
          e->value.tuple = true;
          e->args.push_back(std::move(first));
          while (AcceptOp(",")) {
            if (Peek().text == ")") break;
            ASSIGN_OR_RETURN(auto item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          if (!AcceptOp(")")) return Error(line_, "expected ) to close a tuple");
          return e;
        }
        if (t.text == "[") {
          auto e = Make(Expr::Kind::kList);
          while (!AcceptOp("]")) {
            ASSIGN_OR_RETURN(auto item, ParseExpression(true));
            e->args.push_back(std::move(item));
            if (!AcceptOp(",") && Peek().text != "]") return Error(line_, "expected , or ] in a list");
          }
          return e;
        }
        if (t.text == "{") {
          auto e = Make(Expr::Kind::kDict);
          while (!AcceptOp("}")) {
            ASSIGN_OR_RETURN(auto key, ParseExpression(true));
            if (!AcceptOp(":")) return Error(line_, "expected : in a dict");
            ASSIGN_OR_RETURN(auto value, ParseExpression(true));
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
            if (!AcceptOp(",") && Peek().text != "}") return Error(line_, "expected , or } in a dict");
          }
          return e;
        }
        return Error(line_, absl::StrCat("unexpected `", t.text, "`"));
      case Token::Kind::kEnd:
        return Error(line_, "an expression ends too early");
    }
    return Error(line_, "unexpected token");
  }

  ExprOr ParsePostfix(std::unique_ptr<Expr> e) {
    while (true) {
      if (AcceptOp(".")) {
        const Token t = Next();
        if (t.kind == Token::Kind::kName) {
          auto a = Make(Expr::Kind::kAttr);
          a->name = t.text;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (t.kind == Token::Kind::kInt) {
          auto a = Make(Expr::Kind::kItem);
          a->args.push_back(std::move(e));
          auto index = Make(Expr::Kind::kLiteral);
          index->value = Value::Int(t.i);
          a->args.push_back(std::move(index));
          e = std::move(a);
        } else {
          return Error(line_, "expected an attribute name after .");
        }
      } else if (AcceptOp("[")) {
        ASSIGN_OR_RETURN(e, ParseSubscript(std::move(e)));
      } else if (Peek().text == "(" && Peek().kind == Token::Kind::kOp) {
        ASSIGN_OR_RETURN(e, ParseCall(std::move(e), Expr::Kind::kCall, ""));
      } else {
        return e;
      }
    }
  }

  ExprOr ParseSubscript(std::unique_ptr<Expr> e) {
    std::unique_ptr<Expr> parts[3];
    int colons = 0;
    while (true) {
      if (Peek().text == ":" && Peek().kind == Token::Kind::kOp) {
        Next();
        if (++colons > 2) return Error(line_, "too many : in a slice");
        continue;
      }
      if (Peek().text == "]" && Peek().kind == Token::Kind::kOp) {
        Next();
        break;
      }
      if (parts[colons] != nullptr) return Error(line_, "expected ] or : in a subscript");
      ASSIGN_OR_RETURN(parts[colons], ParseExpression(true));
    }
    if (colons == 0) {
      if (parts[0] == nullptr) return Error(line_, "an empty subscript []");
      auto item = Make(Expr::Kind::kItem);
      item->args.push_back(std::move(e));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = Make(Expr::Kind::kSlice);
    slice->args.push_back(std::move(e));
    for (auto& part : parts) slice->args.push_back(std::move(part));
    return slice;
  }

  // `callee(args, name=value)`, or a filter's / test's arguments (kind kFilter / kTest).
  ExprOr ParseCall(std::unique_ptr<Expr> callee, Expr::Kind kind, std::string name) {
    auto call = Make(kind);
    call->name = std::move(name);
    call->args.push_back(std::move(callee));
    if (!AcceptOp("(")) return call;
    while (!AcceptOp(")")) {
      if (Peek().kind == Token::Kind::kOp && (Peek().text == "*" || Peek().text == "**")) {
        return Error(line_, "*args and **kwargs in calls are not supported");
      }
      if (Peek().kind == Token::Kind::kName && Peek(1).kind == Token::Kind::kOp && Peek(1).text == "=") {
        std::string key = Next().text;
        Next();
        ASSIGN_OR_RETURN(auto value, ParseExpression(true));
        call->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call->kwargs.empty()) return Error(line_, "a positional argument after a keyword argument");
        ASSIGN_OR_RETURN(auto value, ParseExpression(true));
        call->args.push_back(std::move(value));
      }
      if (!AcceptOp(",") && Peek().text != ")") return Error(line_, "expected , or ) in a call");
    }
    return call;
  }

  ExprOr ParseFilters(std::unique_ptr<Expr> e) {
    while (true) {
      if (AcceptOp("|")) {
        if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a filter name after |");
        ASSIGN_OR_RETURN(e, ParseCall(std::move(e), Expr::Kind::kFilter, Next().text));
      } else if (Accept("is")) {
        const bool negated = Accept("not");
        if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a test name after is");
        std::string test = Next().text;
        ASSIGN_OR_RETURN(e, ParseCall(std::move(e), Expr::Kind::kTest, test));
        e->negated = negated;
      } else if (Peek().text == "(" && Peek().kind == Token::Kind::kOp) {
        ASSIGN_OR_RETURN(e, ParseCall(std::move(e), Expr::Kind::kCall, ""));
      } else {
        return e;
      }
    }
  }

  // ---- Tokens.

  const Token& Peek(size_t ahead = 0) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }
  Token Next() {
    const Token t = Peek();
    if (at_ + 1 < tokens_.size()) ++at_;
    return t;
  }
  bool Accept(absl::string_view name) {
    if (Peek().kind != Token::Kind::kName || Peek().text != name) return false;
    Next();
    return true;
  }
  bool AcceptOp(absl::string_view op) {
    if (Peek().kind != Token::Kind::kOp || Peek().text != op) return false;
    Next();
    return true;
  }
  absl::Status ExpectEnd() {
    if (Peek().kind == Token::Kind::kEnd) return absl::OkStatus();
    return Error(line_, absl::StrCat("unexpected `", Peek().text, "`"));
  }

  std::vector<Piece> pieces_;
  std::string name_;
  size_t next_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source, const std::string& name) {
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, SplitTemplate(source, name));
  Parser parser(std::move(pieces), name);
  return parser.Parse();
}

}  // namespace rlfleet::model::jinja
