// Lexer for the program text format (docs/program-format.md): turns text into tokens, each with
// its 1-based line and column (columns count bytes; a tab is one column).
//
// Tokens:
//   identifier  [A-Za-z_][A-Za-z0-9_.]*           keywords, op names, dtypes, attribute names
//   value       %name or %"any string"            name: [A-Za-z0-9_.]+, decoded into Token::text
//   integer     -?[0-9]+                           fits int64
//   float       -?[0-9]+(.[0-9]+)?([eE][+-]?[0-9]+)? with a '.' or an exponent; also -inf, -nan
//               (plain inf and nan lex as identifiers; the parser reads them as floats)
//   string      "..." with escapes \" \\ \n \t \r \xHH, decoded into Token::text
//   punctuation { } ( ) [ ] , : = *
// Whitespace (space, tab, CR, LF) separates tokens and is otherwise insignificant; '#' starts a
// comment that runs to the end of the line.
//
// Failures: Next() throws ParseError("file:line:col: message") at the first byte of the bad token:
// a character that starts no token, an unterminated string, a bad escape, a malformed number, a
// literal out of range. The lexer never allocates more than the text it is given.
//
// Ownership: the lexer borrows the text and the file name; both must outlive it and its tokens.
// Thread-safety: none; one lexer per thread.
//
// Example:
//   Lexer lex("%h: f32[8]", "<input>");
//   for (Token t = lex.Next(); t.kind != TokenKind::kEnd; t = lex.Next()) { ... }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice {

enum class TokenKind : uint8_t {
  kEnd,
  kIdent,
  kValue,
  kInt,
  kFloat,
  kString,
  kLBrace,
  kRBrace,
  kLParen,
  kRParen,
  kLBracket,
  kRBracket,
  kComma,
  kColon,
  kEquals,
  kStar,
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string_view raw;  // the token as written in the text
  std::string text;      // identifier name, decoded string, or value name without '%'
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int col = 1;
};

// How a token reads in an error message: "'%x'", "'('", "end of input".
std::string Describe(const Token& token);

class Lexer {
 public:
  Lexer(std::string_view text, std::string_view file) : text_(text), file_(file) {}

  // The next token; kEnd (repeatedly) once the text is exhausted.
  Token Next();

  [[noreturn]] void Fail(int line, int col, const std::string& message) const;
  [[noreturn]] void Fail(const Token& at, const std::string& message) const {
    Fail(at.line, at.col, message);
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  void Advance();                // one byte, keeping line and column
  void AdvanceWhileIdentChar();  // over [A-Za-z0-9_.]*
  void SkipSpaceAndComments();
  void LexNumber(Token& t);
  void LexValue(Token& t);
  // Reads a double-quoted string starting at the opening quote into `out`.
  void LexString(std::string& out);

  std::string_view text_;
  std::string_view file_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;
};

}  // namespace sluice
