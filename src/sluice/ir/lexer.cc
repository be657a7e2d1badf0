#include "sluice/ir/lexer.h"

#include <charconv>
#include <limits>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsIdentStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsIdentChar(char c) { return IsIdentStart(c) || IsDigit(c) || c == '.'; }

// Printable ASCII as is, anything else as \xHH, at most `limit` bytes of input.
std::string Printable(std::string_view s, size_t limit = 32) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > limit) out += "...";
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Describe(const Token& token) {
  if (token.kind == TokenKind::kEnd) return "end of input";
  return "'" + Printable(token.raw) + "'";
}

void Lexer::Fail(int line, int col, const std::string& message) const {
  throw ParseError(std::string(file_), line, col, message);
}

void Lexer::Advance() {
  if (text_[pos_] == '\n') {
    ++line_;
    col_ = 1;
  } else {
    ++col_;
  }
  ++pos_;
}

void Lexer::AdvanceWhileIdentChar() {
  size_t end = pos_;
  while (end < text_.size() && IsIdentChar(text_[end])) ++end;
  col_ += static_cast<int>(end - pos_);  // no newline among them
  pos_ = end;
}

void Lexer::SkipSpaceAndComments() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c == ' ' || c == '\t' || c == '\r') {
      ++pos_;
      ++col_;
    } else if (c == '\n') {
      ++pos_;
      ++line_;
      col_ = 1;
    } else if (c == '#') {
      while (!AtEnd() && Peek() != '\n') Advance();
    } else {
      return;
    }
  }
}

Token Lexer::Next() {
  SkipSpaceAndComments();
  Token t;
  t.line = line_;
  t.col = col_;
  const size_t start = pos_;
  if (AtEnd()) return t;
  const char c = Peek();
  auto punct = [&](TokenKind kind) {
    t.kind = kind;
    Advance();
  };
  switch (c) {
    case '{':
      punct(TokenKind::kLBrace);
      break;
    case '}':
      punct(TokenKind::kRBrace);
      break;
    case '(':
      punct(TokenKind::kLParen);
      break;
    case ')':
      punct(TokenKind::kRParen);
      break;
    case '[':
      punct(TokenKind::kLBracket);
      break;
    case ']':
      punct(TokenKind::kRBracket);
      break;
    case ',':
      punct(TokenKind::kComma);
      break;
    case ':':
      punct(TokenKind::kColon);
      break;
    case '=':
      punct(TokenKind::kEquals);
      break;
    case '*':
      punct(TokenKind::kStar);
      break;
    case '%':
      LexValue(t);
      break;
    case '"':
      t.kind = TokenKind::kString;
      LexString(t.text);
      break;
    default:
      if (IsDigit(c) || c == '-') {
        LexNumber(t);
      } else if (IsIdentStart(c)) {
        t.kind = TokenKind::kIdent;
        AdvanceWhileIdentChar();
        t.text = std::string(text_.substr(start, pos_ - start));
      } else {
        Fail(line_, col_,
             fmt::format("unexpected character '{}'", Printable(text_.substr(pos_, 1))));
      }
  }
  t.raw = text_.substr(start, pos_ - start);
  return t;
}

void Lexer::LexValue(Token& t) {
  t.kind = TokenKind::kValue;
  Advance();  // '%'
  if (Peek() == '"') {
    LexString(t.text);
    if (t.text.empty()) Fail(t, "a value name cannot be empty");
    return;
  }
  const size_t start = pos_;
  AdvanceWhileIdentChar();
  if (pos_ == start) Fail(t, "expected a value name after '%' (letters, digits, '_' and '.')");
  t.text = std::string(text_.substr(start, pos_ - start));
}

void Lexer::LexNumber(Token& t) {
  const size_t start = pos_;
  bool is_float = false;
  if (Peek() == '-') {
    Advance();
    if (IsIdentStart(Peek())) {  // -inf, -nan
      while (!AtEnd() && IsIdentChar(Peek())) Advance();
      std::string_view word = text_.substr(start + 1, pos_ - start - 1);
      if (word != "inf" && word != "nan") {
        Fail(t, fmt::format("unexpected '-{}': '-' only starts a number", Printable(word)));
      }
      t.kind = TokenKind::kFloat;
      t.float_value = word == "inf" ? -std::numeric_limits<double>::infinity()
                                    : -std::numeric_limits<double>::quiet_NaN();
      return;
    }
    if (!IsDigit(Peek())) Fail(t, "'-' must be followed by a number");
  }
  auto digits = [&] {
    const size_t from = pos_;
    while (!AtEnd() && IsDigit(Peek())) Advance();
    return pos_ > from;
  };
  digits();
  if (Peek() == '.') {
    is_float = true;
    Advance();
    if (!digits()) Fail(t, "malformed number: expected digits after '.'");
  }
  if (Peek() == 'e' || Peek() == 'E') {
    is_float = true;
    Advance();
    if (Peek() == '+' || Peek() == '-') Advance();
    if (!digits()) Fail(t, "malformed number: expected digits in the exponent");
  }
  if (IsIdentChar(Peek())) {
    Fail(t, fmt::format("malformed number '{}'", Printable(text_.substr(start, pos_ - start + 1))));
  }
  const char* first = text_.data() + start;
  const char* last = text_.data() + pos_;
  if (is_float) {
    t.kind = TokenKind::kFloat;
    auto [end, ec] = std::from_chars(first, last, t.float_value);
    if (ec == std::errc::result_out_of_range) {
      Fail(t,
           fmt::format("float literal {} is out of range", std::string_view(first, last - first)));
    }
    SLUICE_CHECK(ec == std::errc() && end == last, "lexed float does not parse");
  } else {
    t.kind = TokenKind::kInt;
    auto [end, ec] = std::from_chars(first, last, t.int_value);
    if (ec == std::errc::result_out_of_range) {
      Fail(t, fmt::format("integer literal {} does not fit in 64 bits",
                          Printable(std::string_view(first, last - first))));
    }
    SLUICE_CHECK(ec == std::errc() && end == last, "lexed integer does not parse");
  }
}

void Lexer::LexString(std::string& out) {
  const int line = line_, col = col_;
  Advance();  // opening quote
  for (;;) {
    if (AtEnd() || Peek() == '\n')
      Fail(line, col, "unterminated string (strings end on the same line)");
    const char c = Peek();
    if (c == '"') {
      Advance();
      return;
    }
    if (c == '\\') {
      const int esc_line = line_, esc_col = col_;
      Advance();
      if (AtEnd() || Peek() == '\n')
        Fail(line, col, "unterminated string (strings end on the same line)");
      const char e = Peek();
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'x': {
          const int hi = HexDigit(Peek(1)), lo = HexDigit(Peek(2));
          if (hi < 0 || lo < 0) Fail(esc_line, esc_col, "bad escape: \\x needs two hex digits");
          out += static_cast<char>(hi * 16 + lo);
          Advance();
          Advance();
          break;
        }
        default:
          Fail(esc_line, esc_col,
               fmt::format("unknown escape '\\{}' (use \\\" \\\\ \\n \\t \\r or \\xHH)",
                           Printable(text_.substr(pos_, 1))));
      }
      Advance();
      continue;
    }
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      Fail(line_, col_,
           fmt::format("control character '{}' in a string (write it as \\xHH)",
                       Printable(text_.substr(pos_, 1))));
    }
    out += c;
    Advance();
  }
}

}  // namespace sluice
