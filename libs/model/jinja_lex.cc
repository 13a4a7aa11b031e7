// Reading a Jinja template's text: the pieces (text, {{ }} and {% %}) with Jinja's
// whitespace rules (trim_blocks, lstrip_blocks, `-` and `+` markers, comments dropped,
// one trailing newline dropped), and the tokens inside a tag (jinja2/lexer.py).
#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/model/jinja_internal.h"

namespace rlfleet::model::jinja {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string RStrip(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && IsSpace(s[end - 1])) --end;
  return s.substr(0, end);
}

// Where the tag opened at `from` ends: the first `close` ("}}", "%}" or "#}") outside a
// string literal (comments have none). npos when it never closes.
size_t FindTagEnd(const std::string& src, size_t from, char close, bool strings) {
  char quote = 0;
  for (size_t i = from; i + 1 < src.size(); ++i) {
    const char c = src[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (strings && (c == '\'' || c == '"')) {
      quote = c;
    } else if (c == close && src[i + 1] == '}') {
      return i;
    }
  }
  return std::string::npos;
}

absl::StatusOr<std::string> Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case '0':
        out.push_back('\0');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\n':
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        if (i + digits >= s.size()) return absl::InvalidArgumentError("a \\x/\\u escape is cut short");
        for (size_t k = 1; k <= digits; ++k) {
          const char h = s[i + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return absl::InvalidArgumentError("a bad \\x/\\u escape");
          cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        i += digits;
        if (cp > 0x10FFFF) return absl::InvalidArgumentError("a \\U escape past U+10FFFF");
        out += EncodeUtf8(std::u32string(1, static_cast<char32_t>(cp)));
        break;
      }
      default:  // Python keeps an unknown escape as written
        out.push_back('\\');
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace

// Splits the template into pieces, as jinja2/lexer.py does with trim_blocks and
// lstrip_blocks on and keep_trailing_newline off.
absl::StatusOr<std::vector<Piece>> SplitTemplate(absl::string_view source, const std::string& name) {
  // Newlines normalised to \n and one trailing newline dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();

  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;  // the last tag's end consumed a newline (or nothing came yet)
  while (pos < src.size()) {
    size_t start = pos;
    while (true) {
      start = src.find('{', start);
      if (start == std::string::npos || start + 1 >= src.size()) {
        start = std::string::npos;
        break;
      }
      const char k = src[start + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++start;
    }
    if (start == std::string::npos) {
      pieces.push_back({Piece::Kind::kText, src.substr(pos), line});
      break;
    }
    std::string text = src.substr(pos, start - pos);
    const char kind = src[start + 1];
    const char sign = start + 2 < src.size() && (src[start + 2] == '-' || src[start + 2] == '+') ? src[start + 2] : 0;
    if (sign == '-') {
      text = RStrip(text);
    } else if (sign != '+' && kind != '{') {
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        bool blank = true;
        for (size_t i = l_pos; i < text.size(); ++i) blank = blank && IsSpace(text[i]);
        if (blank) text.resize(l_pos);
      }
    }
    for (char c : src.substr(pos, start - pos)) line += c == '\n';
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, line});
    const int tag_line = line;
    const size_t inner = start + 2 + (sign != 0 ? 1 : 0);
    const char close = kind == '{' ? '}' : kind;
    const size_t end = FindTagEnd(src, inner, close, kind != '#');
    if (end == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("chat template ", name, " line ", tag_line,
                                                     ": a tag opened with {", std::string(1, kind),
                                                     " is never closed"));
    }
    size_t inner_end = end;
    char end_sign = 0;
    if (end > inner && (src[end - 1] == '-' || src[end - 1] == '+') && kind != '{') {
      end_sign = src[end - 1];
      --inner_end;
    } else if (end > inner && src[end - 1] == '-') {
      end_sign = '-';
      --inner_end;
    }
    const std::string body = src.substr(inner, inner_end - inner);
    for (char c : body) line += c == '\n';
    pos = end + 2;
    size_t after = pos;
    if (end_sign == '-') {
      while (after < src.size() && IsSpace(src[after])) ++after;
    } else if (end_sign != '+' && kind != '{' && after < src.size() && src[after] == '\n') {
      ++after;  // trim_blocks
    }
    line_starting = after > pos && src[after - 1] == '\n';
    for (size_t i = pos; i < after; ++i) line += src[i] == '\n';
    pos = after;
    if (kind == '{') pieces.push_back({Piece::Kind::kPrint, body, tag_line});
    if (kind == '%') pieces.push_back({Piece::Kind::kStatement, body, tag_line});
  }
  return pieces;
}

absl::StatusOr<std::vector<Token>> Tokenize(const std::string& s) {
  static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "(",
                                     ")",  "[",  "]",  "{",  "}",  ",",  ".", ":", "|", "=", "<", ">", ";"};
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (IsSpace(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      tokens.push_back({Token::Kind::kName, s.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string digits;
      for (size_t k = i; k < j; ++k) {
        if (s[k] != '_') digits.push_back(s[k]);
      }
      Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits};
      if (is_float ? !absl::SimpleAtod(digits, &t.f) : !absl::SimpleAtoi(digits, &t.i)) {
        return absl::InvalidArgumentError(absl::StrCat("the number ", digits, " does not parse"));
      }
      tokens.push_back(t);
      i = j;
    } else if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) j += s[j] == '\\' ? 2 : 1;
      if (j >= s.size()) return absl::InvalidArgumentError("a string literal is never closed");
      ASSIGN_OR_RETURN(std::string value, Unescape(absl::string_view(s).substr(i + 1, j - i - 1)));
      tokens.push_back({Token::Kind::kString, value});
      i = j + 1;
    } else {
      bool found = false;
      for (const char* op : kOps) {
        if (absl::StartsWith(absl::string_view(s).substr(i), op)) {
          tokens.push_back({Token::Kind::kOp, op});
          i += std::string(op).size();
          found = true;
          break;
        }
      }
      if (!found) return absl::InvalidArgumentError(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  tokens.push_back({Token::Kind::kEnd, ""});
  return tokens;
}

}  // namespace rlfleet::model::jinja
