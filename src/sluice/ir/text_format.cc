#include "sluice/ir/text_format.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/ir/lexer.h"
#include "sluice/ir/verifier.h"

namespace sluice {

// ---------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------

namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.';
}

// [A-Za-z_][A-Za-z0-9_.]*: what the lexer reads as one identifier.
bool IsIdentifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9') || s[0] == '.') return false;
  return std::all_of(s.begin(), s.end(), IsNameChar);
}

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
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
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// %name, or %"name" when the name has characters a bare value name cannot.
std::string ValueRef(std::string_view name) {
  const bool bare = !name.empty() && std::all_of(name.begin(), name.end(), IsNameChar);
  return "%" + (bare ? std::string(name) : Quote(name));
}

std::string IdentOrQuoted(std::string_view s) {
  return IsIdentifier(s) ? std::string(s) : Quote(s);
}

std::string FormatAttr(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          return fmt::format("{}", v);
        } else if constexpr (std::is_same_v<T, double>) {
          return FormatFloat(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return Quote(v);
        } else {
          return fmt::format("[{}]", fmt::join(v, ", "));
        }
      },
      value);
}

std::string Typed(const Program& p, ValueId id) {
  const Value& v = p.value(id);
  return ValueRef(v.name) + ": " + p.type(id).ToString();
}

}  // namespace

std::string FormatFloat(double value) {
  std::string s = fmt::format("{}", value);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // 'n' covers inf and nan
  return s;
}

std::string PrintProgram(const Program& p) {
  std::string out = fmt::format("program {} {{\n", IdentOrQuoted(p.name()));
  for (ValueId v : p.inputs()) out += fmt::format("  input {}\n", Typed(p, v));
  for (ValueId v : p.params()) out += fmt::format("  param {}\n", Typed(p, v));
  for (const Instruction& ins : p.instructions()) {
    out += "  ";
    for (size_t i = 0; i < ins.outputs.size(); ++i) {
      out += (i ? ", " : "") + Typed(p, ins.outputs[i]);
    }
    if (!ins.outputs.empty()) out += " = ";
    out += ins.op ? ins.op->name : "?";
    out += "(";
    for (size_t i = 0; i < ins.inputs.size(); ++i) {
      out += (i ? ", " : "") + ValueRef(p.value(ins.inputs[i]).name);
    }
    out += ")";
    if (!ins.attrs.empty()) {
      out += " {";
      bool first = true;
      for (const auto& [name, value] : ins.attrs.items()) {
        out += fmt::format("{}{} = {}", first ? "" : ", ", IdentOrQuoted(name), FormatAttr(value));
        first = false;
      }
      out += "}";
    }
    out += "\n";
  }
  for (ValueId v : p.outputs()) out += fmt::format("  output {}\n", ValueRef(p.value(v).name));
  out += "}\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

namespace {

const char* KindName(TokenKind kind) {
  switch (kind) {
    case TokenKind::kEnd:
      return "end of input";
    case TokenKind::kIdent:
      return "a name";
    case TokenKind::kValue:
      return "a value (%name)";
    case TokenKind::kInt:
      return "an integer";
    case TokenKind::kFloat:
      return "a float";
    case TokenKind::kString:
      return "a string";
    case TokenKind::kLBrace:
      return "'{'";
    case TokenKind::kRBrace:
      return "'}'";
    case TokenKind::kLParen:
      return "'('";
    case TokenKind::kRParen:
      return "')'";
    case TokenKind::kLBracket:
      return "'['";
    case TokenKind::kRBracket:
      return "']'";
    case TokenKind::kComma:
      return "','";
    case TokenKind::kColon:
      return "':'";
    case TokenKind::kEquals:
      return "'='";
  }
  return "?";
}

// One output written on the left of an instruction: where it is, its name, its declared type.
struct Result {
  Token at;
  TensorType type;
};

// Recursive descent over a flat grammar: no rule nests inside itself, so the parser needs no
// recursion at all and its depth does not depend on the input.
class Parser {
 public:
  Parser(std::string_view text, std::string_view file) : lex_(text, file) {}

  Program Parse() {
    Advance();
    const Token keyword = tok_;
    if (tok_.kind != TokenKind::kIdent || tok_.text != "program") {
      Fail(tok_, fmt::format("expected 'program', found {}", Describe(tok_)));
    }
    Advance();
    if (tok_.kind != TokenKind::kIdent && tok_.kind != TokenKind::kString) {
      Fail(tok_, fmt::format("expected the program's name, found {}", Describe(tok_)));
    }
    program_ = Program(tok_.text);
    Advance();
    const Token open = Take(TokenKind::kLBrace, "to open the program body");
    while (tok_.kind != TokenKind::kRBrace) {
      if (tok_.kind == TokenKind::kEnd) {
        Fail(tok_, fmt::format("unterminated program: expected '}}' to close the '{{' at {}:{}",
                               open.line, open.col));
      }
      ParseStatement();
    }
    Advance();
    if (tok_.kind != TokenKind::kEnd) {
      Fail(tok_, fmt::format("unexpected {} after the end of the program (one program per file)",
                             Describe(tok_)));
    }
    try {
      VerifyOnce(program_);
    } catch (const Error& e) {
      Fail(keyword, e.what());
    }
    return std::move(program_);
  }

 private:
  [[noreturn]] void Fail(const Token& at, const std::string& message) const {
    lex_.Fail(at, message);
  }

  void Advance() { tok_ = lex_.Next(); }

  // Consumes a token of `kind` or fails saying what was expected and why.
  // `purpose` says in the error what the token is for: text, or a function returning the text,
  // called only on failure (a large program takes millions of tokens, nearly all fine).
  template <typename Purpose>
  Token Take(TokenKind kind, const Purpose& purpose) {
    if (tok_.kind != kind) {
      std::string text;
      if constexpr (std::is_invocable_v<Purpose>) {
        text = purpose();
      } else {
        text = std::string_view(purpose);
      }
      Fail(tok_, fmt::format("expected {} {}, found {}", KindName(kind), text, Describe(tok_)));
    }
    Token t = std::move(tok_);
    Advance();
    return t;
  }

  bool Accept(TokenKind kind) {
    if (tok_.kind != kind) return false;
    Advance();
    return true;
  }

  void ParseStatement() {
    if (tok_.kind == TokenKind::kValue) {
      ParseInstruction();
      return;
    }
    if (tok_.kind != TokenKind::kIdent) {
      Fail(tok_, fmt::format("expected a statement (input, param, output or an instruction), "
                             "found {}",
                             Describe(tok_)));
    }
    Token word = std::move(tok_);
    Advance();
    if (tok_.kind == TokenKind::kLParen) {  // an instruction without outputs: op(...)
      ParseCall(word, {});
    } else if (word.text == "input" || word.text == "param") {
      ParseDeclaration(word.text == "input");
    } else if (word.text == "output") {
      const Token v = Take(TokenKind::kValue, "after 'output'");
      const ValueId id = Use(v);
      if (program_.IsOutput(id)) {
        Fail(v, fmt::format("{} is already an output", ValueRef(v.text)));
      }
      program_.AddOutput(id);
    } else {
      Fail(word, fmt::format("expected a statement (input, param, output or an instruction), "
                             "found {}",
                             Describe(word)));
    }
  }

  // input %x: f32[8, 16]   |   param %w: f32[16, 4]
  void ParseDeclaration(bool is_input) {
    const Token v = Take(TokenKind::kValue, is_input ? "after 'input'" : "after 'param'");
    Take(TokenKind::kColon, [&] { return fmt::format("after {}", ValueRef(v.text)); });
    const TensorType type = ParseType();
    ValueId id;
    try {
      id = is_input ? program_.AddInput(v.text, type) : program_.AddParam(v.text, type);
    } catch (const ProgramError&) {
      CheckUnused(v);  // a taken name: say where it was defined
      throw;
    }
    Record(id, v);
  }

  // %a: T, %b: T = op(%x, %y) {attrs}
  void ParseInstruction() {
    std::vector<Result> results;
    for (;;) {
      Token v = Take(TokenKind::kValue, "to name an output");
      Take(TokenKind::kColon, [&] {
        return fmt::format("after {} (every output is written with its type)", ValueRef(v.text));
      });
      TensorType type = ParseType();
      results.push_back({std::move(v), std::move(type)});
      if (!Accept(TokenKind::kComma)) break;
    }
    Take(TokenKind::kEquals, "after the outputs");
    Token op = Take(TokenKind::kIdent, "(an op name) after '='");
    ParseCall(op, std::move(results));
  }

  // The part from the op's '(' on; `op` is the op-name token already consumed.
  void ParseCall(const Token& op_token, std::vector<Result> results) {
    const OpDef* op = OpRegistry::Global().Find(op_token.text);
    if (op == nullptr) Fail(op_token, fmt::format("unknown op '{}'", op_token.text));
    Take(TokenKind::kLParen, [&] { return fmt::format("after '{}'", op->name); });
    ValueList inputs;
    if (tok_.kind != TokenKind::kRParen) {
      do {
        inputs.push_back(Use(
            Take(TokenKind::kValue, [&] { return fmt::format("as an input of {}", op->name); })));
      } while (Accept(TokenKind::kComma));
    }
    Take(TokenKind::kRParen, [&] { return fmt::format("to close the inputs of {}", op->name); });
    Attrs attrs;
    if (tok_.kind == TokenKind::kLBrace) {
      for (const Token& key : ParseAttrs(attrs)) {
        std::string undeclared = UndeclaredAttrMessage(*op, key.text);
        if (!undeclared.empty()) Fail(key, undeclared);
      }
    }

    if (op->num_inputs >= 0 && static_cast<int>(inputs.size()) != op->num_inputs) {
      Fail(op_token, fmt::format("{} takes {} input{}, got {}", op->name, op->num_inputs,
                                 op->num_inputs == 1 ? "" : "s", inputs.size()));
    }
    if (op->num_inputs < 0 && inputs.empty()) {
      Fail(op_token, fmt::format("{} takes at least one input", op->name));
    }
    std::vector<std::string> names;
    names.reserve(results.size());
    for (const Result& r : results) names.push_back(r.at.text);
    // A name taken by a value above or by an earlier output fails here before anything else the
    // program checks: AddInstruction fails on it too, and only then are the names looked at.
    auto check_names = [&] {
      std::unordered_map<std::string_view, const Token*> earlier;  // linear in the outputs
      for (const Result& r : results) {
        CheckUnused(r.at);
        auto [it, added] = earlier.emplace(r.at.text, &r.at);
        if (!added) FailTaken(r.at, {it->second->line, it->second->col});
      }
    };
    ValueList outputs;
    try {
      outputs =
          program_.AddInstruction(op->name, std::move(inputs), std::move(attrs), std::move(names));
    } catch (const Error& e) {
      check_names();
      Fail(op_token, e.what());
    } catch (const std::exception& e) {
      check_names();
      Fail(op_token, fmt::format("internal error in {} (a bug in sluice, please report it): {}",
                                 op->name, e.what()));
    }
    for (size_t i = 0; i < std::min(outputs.size(), results.size()); ++i) {
      Record(outputs[i], results[i].at);
    }
    if (outputs.size() != results.size()) {
      Fail(op_token, fmt::format("{} produces {} output{}, the instruction names {}", op->name,
                                 outputs.size(), outputs.size() == 1 ? "" : "s", results.size()));
    }
    for (size_t i = 0; i < results.size(); ++i) {
      const TensorType& inferred = program_.type(outputs[i]);
      if (inferred != results[i].type) {
        Fail(results[i].at,
             fmt::format("{} is declared {} but {} gives {}", ValueRef(results[i].at.text),
                         results[i].type.ToString(), op->name, inferred.ToString()));
      }
    }
  }

  // f32[8, 16]; f32[] is a scalar.
  TensorType ParseType() {
    const Token dtype = Take(TokenKind::kIdent, "(a dtype such as f32)");
    std::optional<DType> t = ParseDType(dtype.text);
    if (!t) {
      Fail(dtype, fmt::format("unknown dtype '{}' (expected f32, f64, bf16, f16, i32 or i64)",
                              dtype.text));
    }
    Take(TokenKind::kLBracket, "to open the dimensions (a scalar is written f32[])");
    std::array<int64_t, kMaxRank> dims;
    int rank = 0;
    int64_t elements = 1;  // product of the dimensions, a 0 counting as 1
    if (tok_.kind != TokenKind::kRBracket) {
      do {
        const Token d = Take(TokenKind::kInt, "(a dimension)");
        if (rank == kMaxRank) {
          Fail(d, fmt::format("a type has at most {} dimensions", kMaxRank));
        }
        if (d.int_value < 0) Fail(d, fmt::format("dimension {} is negative", d.int_value));
        if (d.int_value > 0 && elements > kMaxTextElements / d.int_value) {
          Fail(d, fmt::format("type too large: more than 2^40 elements"));
        }
        elements *= std::max<int64_t>(d.int_value, 1);
        dims[rank++] = d.int_value;
      } while (Accept(TokenKind::kComma));
    }
    Take(TokenKind::kRBracket, "to close the dimensions");
    return {*t, Shape(std::span<const int64_t>(dims.data(), static_cast<size_t>(rank)))};
  }

  // {name = value, ...} into `attrs`; returns the name tokens, in the order written, so that
  // the caller can point at a name the op does not declare.
  std::vector<Token> ParseAttrs(Attrs& attrs) {
    Take(TokenKind::kLBrace, "to open the attributes");
    std::vector<Token> keys;
    if (Accept(TokenKind::kRBrace)) return keys;
    do {
      if (tok_.kind != TokenKind::kIdent && tok_.kind != TokenKind::kString) {
        Fail(tok_, fmt::format("expected an attribute name, found {}", Describe(tok_)));
      }
      Token key = std::move(tok_);
      Advance();
      if (attrs.Has(key.text)) Fail(key, fmt::format("attribute '{}' is given twice", key.text));
      Take(TokenKind::kEquals, [&] { return fmt::format("after attribute '{}'", key.text); });
      attrs.Set(key.text, ParseAttrValue());
      keys.push_back(std::move(key));
    } while (Accept(TokenKind::kComma));
    Take(TokenKind::kRBrace, "to close the attributes");
    return keys;
  }

  // 1, -2.5, 1e-05, inf, -nan, true, "text", [1, -2]
  AttrValue ParseAttrValue() {
    Token t = std::move(tok_);
    Advance();
    switch (t.kind) {
      case TokenKind::kInt:
        return t.int_value;
      case TokenKind::kFloat:
        return t.float_value;
      case TokenKind::kString:
        return std::move(t.text);
      case TokenKind::kIdent:
        if (t.text == "true") return true;
        if (t.text == "false") return false;
        if (t.text == "inf") return std::numeric_limits<double>::infinity();
        if (t.text == "nan") return std::numeric_limits<double>::quiet_NaN();
        break;
      case TokenKind::kLBracket: {
        std::vector<int64_t> list;
        if (tok_.kind != TokenKind::kRBracket) {
          do {
            if (tok_.kind != TokenKind::kInt) {
              Fail(tok_,
                   fmt::format("attribute lists hold integers only, found {}", Describe(tok_)));
            }
            list.push_back(tok_.int_value);
            Advance();
          } while (Accept(TokenKind::kComma));
        }
        Take(TokenKind::kRBracket, "to close the list");
        return list;
      }
      default:
        break;
    }
    Fail(t, fmt::format("expected an attribute value (integer, float, true, false, string or "
                        "[integers]), found {}",
                        Describe(t)));
  }

  // The value a %name refers to; it must be defined above.
  ValueId Use(const Token& v) {
    std::optional<ValueId> id = program_.Find(v.text);
    if (!id)
      Fail(v, fmt::format("undefined value {} (values are defined before use)", ValueRef(v.text)));
    return *id;
  }

  // Fails when the name a definition claims is taken by a value above.
  void CheckUnused(const Token& v) {
    if (std::optional<ValueId> id = program_.Find(v.text)) {
      FailTaken(v, defined_at_[static_cast<size_t>(*id)]);
    }
  }

  [[noreturn]] void FailTaken(const Token& v, std::pair<int, int> at) const {
    Fail(v, fmt::format("{} is already defined at {}:{}", ValueRef(v.text), at.first, at.second));
  }

  // Where value `id` was defined (for the message of a later duplicate).
  void Record(ValueId id, const Token& v) {
    defined_at_.resize(program_.values().size());
    defined_at_[static_cast<size_t>(id)] = {v.line, v.col};
  }

  Lexer lex_;
  Token tok_;
  Program program_;
  std::vector<std::pair<int, int>> defined_at_;  // value -> line, col of its definition
};

}  // namespace

Program ParseProgram(std::string_view text, std::string_view filename) {
  return Parser(text, filename).Parse();
}

Program LoadProgramFile(const std::string& path) {
  return ParseProgram(ReadWholeFile("program file", path), path);
}

}  // namespace sluice
