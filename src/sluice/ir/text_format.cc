#include "sluice/ir/text_format.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
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

namespace {

std::string FormatInitializer(const Initializer& init) {
  if (init.args.empty()) return init.kind;
  return fmt::format("{}({})", init.kind, fmt::join(init.args, ", "));
}

std::string FormatInstruction(const Program& p, const Instruction& ins) {
  std::string out;
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
  return out;
}

}  // namespace

std::string PrintProgram(const Program& p, const ProgramAnnotations* annotations) {
  std::string out = fmt::format("program {} {{\n", IdentOrQuoted(p.name()));
  for (ValueId v : p.inputs()) {
    out += fmt::format("  input {}", Typed(p, v));
    if (annotations) {
      auto it = annotations->data.find(p.value(v).name);
      if (it != annotations->data.end()) out += " = " + IdentOrQuoted(it->second);
    }
    out += "\n";
  }
  for (ValueId v : p.params()) {
    out += fmt::format("  {} {}",
                       p.IsBuffer(v)     ? "buffer"
                       : p.IsConstant(v) ? "const"
                                         : "param",
                       Typed(p, v));
    if (annotations) {
      auto it = annotations->initializers.find(p.value(v).name);
      if (it != annotations->initializers.end()) out += " = " + FormatInitializer(it->second);
    }
    out += "\n";
  }
  const std::vector<ProgramUnit>& units = p.units();
  size_t u = 0;       // the next unit to open
  bool open = false;  // units[u - 1] is open
  const auto n = static_cast<int32_t>(p.instructions().size());
  for (int32_t i = 0; i <= n; ++i) {
    if (open && units[u - 1].end == i) {
      out += "  }\n";
      open = false;
    }
    while (!open && u < units.size() && units[u].begin == i) {
      out += fmt::format("  unit {} {{\n", IdentOrQuoted(units[u].name));
      open = units[u].end > i;
      if (!open) out += "  }\n";
      ++u;
    }
    if (i == n) break;
    out += (open ? "    " : "  ") + FormatInstruction(p, p.instructions()[static_cast<size_t>(i)]) +
           "\n";
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
    case TokenKind::kStar:
      return "'*'";
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
  Parser(std::string_view text, std::string_view file, const SizeBindings& sizes,
         ProgramAnnotations* annotations, const InputCheck& check_input)
      : lex_(text, file),
        sizes_(sizes),
        annotations_(annotations ? annotations : &discarded_),
        check_input_(check_input) {}

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
    for (;;) {
      if (tok_.kind == TokenKind::kRBrace) {
        if (!program_.unit_open()) break;
        program_.EndUnit();
        Advance();
        continue;
      }
      if (tok_.kind == TokenKind::kEnd) {
        if (program_.unit_open()) {
          Fail(tok_, fmt::format("unterminated unit '{}': expected '}}' to close the '{{' at {}:{}",
                                 program_.units().back().name, unit_open_.line, unit_open_.col));
        }
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
    } catch (const VerifyError& e) {
      // At the instruction or output statement it concerns, else at the program.
      const auto i = static_cast<size_t>(e.instruction());
      if (e.instruction() >= 0 && i < instruction_at_.size()) {
        lex_.Fail(instruction_at_[i].first, instruction_at_[i].second, e.what());
      }
      if (auto it = output_at_.find(e.output()); it != output_at_.end()) {
        lex_.Fail(it->second.first, it->second.second, e.what());
      }
      Fail(keyword, e.what());
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
      Fail(tok_,
           fmt::format("expected a statement (input, param, const, buffer, output, unit or an "
                       "instruction), "
                       "found {}",
                       Describe(tok_)));
    }
    Token word = std::move(tok_);
    Advance();
    if (tok_.kind == TokenKind::kLParen) {  // an instruction without outputs: op(...)
      ParseCall(word, {});
    } else if (word.text == "input" || word.text == "param" || word.text == "const" ||
               word.text == "buffer") {
      ParseDeclaration(word.text);
    } else if (word.text == "unit") {
      ParseUnit(word);
    } else if (word.text == "output") {
      const Token v = Take(TokenKind::kValue, "after 'output'");
      const ValueId id = Use(v);
      if (program_.IsOutput(id)) {
        Fail(v, fmt::format("{} is already an output", ValueRef(v.text)));
      }
      program_.AddOutput(id);
      output_at_[id] = {v.line, v.col};
      annotations_->output_at[v.text] = {v.line, v.col};
    } else {
      Fail(word,
           fmt::format("expected a statement (input, param, const, buffer, output, unit or an "
                       "instruction), "
                       "found {}",
                       Describe(word)));
    }
  }

  // unit h.0 {   (the statements up to the matching '}' belong to the unit)
  void ParseUnit(const Token& keyword) {
    if (tok_.kind != TokenKind::kIdent && tok_.kind != TokenKind::kString) {
      Fail(tok_, fmt::format("expected the unit's name after 'unit', found {}", Describe(tok_)));
    }
    const Token name = std::move(tok_);
    Advance();
    if (program_.unit_open()) {
      Fail(keyword, fmt::format("unit '{}' opens inside unit '{}' (units do not nest)", name.text,
                                program_.units().back().name));
    }
    for (const ProgramUnit& u : program_.units()) {
      if (u.name == name.text) Fail(name, fmt::format("unit '{}' is defined twice", name.text));
    }
    unit_open_ =
        Take(TokenKind::kLBrace, [&] { return fmt::format("after unit '{}'", name.text); });
    program_.BeginUnit(name.text);
  }

  // input %x: f32[8, 16] [= array]   |   param %w: f32[16, 4] [= initializer]
  // const %c: f32[16, 4] [= initializer]   |   buffer %m: f32[16] [= initializer]
  void ParseDeclaration(const std::string& keyword) {
    const bool is_input = keyword == "input";
    const Token v = Take(TokenKind::kValue, [&] { return fmt::format("after '{}'", keyword); });
    Take(TokenKind::kColon, [&] { return fmt::format("after {}", ValueRef(v.text)); });
    const TensorType type = ParseType();
    ValueId id;
    try {
      id = is_input              ? program_.AddInput(v.text, type)
           : keyword == "const"  ? program_.AddConst(v.text, type)
           : keyword == "buffer" ? program_.AddBuffer(v.text, type)
                                 : program_.AddParam(v.text, type);
    } catch (const ProgramError&) {
      CheckUnused(v);  // a taken name: say where it was defined
      throw;
    }
    Record(id, v);
    annotations_->declared_at[v.text] = {v.line, v.col};
    std::string array = v.text;
    if (Accept(TokenKind::kEquals)) {
      if (is_input) {
        if (tok_.kind != TokenKind::kIdent && tok_.kind != TokenKind::kString) {
          Fail(tok_, fmt::format("expected the name of the data array {} binds after '=', found {}",
                                 ValueRef(v.text), Describe(tok_)));
        }
        array = tok_.text;
        annotations_->data[v.text] = array;
        Advance();
      } else {
        annotations_->initializers[v.text] = ParseInitializer(v);
      }
    }
    if (is_input && check_input_) {
      try {
        check_input_(v.text, type, array);
      } catch (const InvalidArgument& e) {
        Fail(v, e.what());
      }
    }
  }

  // normal(0, 0.02) | uniform(-0.1, 0.1) | zeros | ones | loaded
  Initializer ParseInitializer(const Token& param) {
    const Token kind = Take(TokenKind::kIdent, [&] {
      return fmt::format("(an initializer: normal, uniform, zeros, ones or loaded) for {}",
                         ValueRef(param.text));
    });
    Initializer init{kind.text, {}};
    if (Accept(TokenKind::kLParen) && !Accept(TokenKind::kRParen)) {
      do {
        if (tok_.kind == TokenKind::kInt) {
          init.args.push_back(static_cast<double>(tok_.int_value));
        } else if (tok_.kind == TokenKind::kFloat) {
          init.args.push_back(tok_.float_value);
        } else {
          Fail(tok_,
               fmt::format("{}'s arguments are numbers, found {}", kind.text, Describe(tok_)));
        }
        if (!std::isfinite(init.args.back())) {
          Fail(tok_,
               fmt::format("{}'s arguments must be finite, found {}", kind.text, Describe(tok_)));
        }
        Advance();
      } while (Accept(TokenKind::kComma));
      Take(TokenKind::kRParen, [&] { return fmt::format("to close {}'s arguments", kind.text); });
    }
    auto want = [&](size_t n, const char* signature) {
      if (init.args.size() != n) {
        Fail(kind, fmt::format("{} takes {} argument{} ({}), got {}", kind.text, n,
                               n == 1 ? "" : "s", signature, init.args.size()));
      }
    };
    if (init.kind == "normal") {
      want(2, "mean, std");
      if (!(init.args[1] > 0)) {
        Fail(kind, fmt::format("normal's std must be positive, got {}", init.args[1]));
      }
    } else if (init.kind == "uniform") {
      want(2, "low, high");
      if (!(init.args[0] < init.args[1])) {
        Fail(kind, fmt::format("uniform's low must be below its high, got {} and {}", init.args[0],
                               init.args[1]));
      }
    } else if (init.kind == "zeros" || init.kind == "ones" || init.kind == "loaded") {
      want(0, "none");
    } else {
      Fail(kind, fmt::format("unknown initializer '{}' for {} (expected normal(mean, std), "
                             "uniform(low, high), zeros, ones or loaded)",
                             kind.text, ValueRef(param.text)));
    }
    return init;
  }

  // INT or a size name, optionally times more of them: 8, B, B*T, 3*C. The caller has checked
  // that tok_ starts one.
  int64_t ParseSizeProduct() {
    int64_t product = 1;
    bool first = true;
    for (;;) {
      const Token t = std::move(tok_);
      Advance();
      int64_t factor = 0;
      if (t.kind == TokenKind::kInt) {
        factor = t.int_value;
      } else if (t.kind == TokenKind::kIdent && IsSizeName(t.text)) {
        auto it = sizes_.find(t.text);
        if (it == sizes_.end()) {
          Fail(t, fmt::format("size '{}' is not bound here ({})", t.text,
                              sizes_.empty() ? "sluice train, plan and simulate bind B to the "
                                               "micro-batch and T to the sequence length; sluice "
                                               "run takes --size B=8"
                                             : fmt::format("bound sizes: {}", BoundSizes())));
        }
        factor = it->second;
        annotations_->sizes.insert(t.text);
      } else {
        Fail(t, fmt::format("expected an integer or a size name{}, found {}",
                            first ? "" : " after '*'", Describe(t)));
      }
      if (!first && factor < 0) Fail(t, "a factor after '*' may not be negative");
      if (__builtin_mul_overflow(product, factor, &product)) {
        Fail(t, "the product overflows int64");
      }
      first = false;
      if (!Accept(TokenKind::kStar)) return product;
    }
  }

  // Whether tok_ can start a size product.
  bool AtSize() const {
    return tok_.kind == TokenKind::kInt ||
           (tok_.kind == TokenKind::kIdent && IsSizeName(tok_.text));
  }

  // A name that is no keyword of a value position: true, false, inf and nan are values.
  static bool IsSizeName(std::string_view s) {
    return s != "true" && s != "false" && s != "inf" && s != "nan";
  }

  std::string BoundSizes() const {
    std::string out;
    for (const auto& [name, value] : sizes_) {
      out += fmt::format("{}{} = {}", out.empty() ? "" : ", ", name, value);
    }
    return out;
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
    instruction_at_.emplace_back(op_token.line, op_token.col);
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
        const Token d = tok_;
        if (!AtSize()) {
          Fail(tok_, fmt::format("expected a dimension (an integer or a size name such as B), "
                                 "found {}",
                                 Describe(tok_)));
        }
        const int64_t dim = ParseSizeProduct();
        if (rank == kMaxRank) {
          Fail(d, fmt::format("a type has at most {} dimensions", kMaxRank));
        }
        if (dim < 0) Fail(d, fmt::format("dimension {} is negative", dim));
        if (dim > 0 && elements > kMaxTextElements / dim) {
          Fail(d, fmt::format("type too large: more than 2^40 elements"));
        }
        elements *= std::max<int64_t>(dim, 1);
        dims[rank++] = dim;
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
    // A bare name is a size only when bound: otherwise the message below says what values are.
    if (tok_.kind == TokenKind::kInt ||
        (tok_.kind == TokenKind::kIdent && sizes_.find(tok_.text) != sizes_.end())) {
      return ParseSizeProduct();
    }
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
            if (!AtSize()) {
              Fail(tok_,
                   fmt::format("attribute lists hold integers only, found {}", Describe(tok_)));
            }
            list.push_back(ParseSizeProduct());
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
  // For the verifier's errors (VerifyError): each instruction's op name, in program order, and
  // each output statement's value, by value: line, col.
  std::vector<std::pair<int, int>> instruction_at_;
  std::unordered_map<ValueId, std::pair<int, int>> output_at_;
  const SizeBindings& sizes_;
  ProgramAnnotations discarded_;     // where annotations go when the caller wants none
  ProgramAnnotations* annotations_;  // never null
  Token unit_open_;                  // the '{' of the open unit
  const InputCheck& check_input_;
};

}  // namespace

Program ParseProgram(std::string_view text, std::string_view filename, const SizeBindings& sizes,
                     ProgramAnnotations* annotations, const InputCheck& check_input) {
  return Parser(text, filename, sizes, annotations, check_input).Parse();
}

Program LoadProgramFile(const std::string& path) {
  return ParseProgram(ReadWholeFile("program file", path), path);
}

}  // namespace sluice

namespace sluice {

namespace {

// The product of sizes (each to a power 0..2) times a factor that gives `a` under `sizes_a` and `b`
// under `sizes_b`, lowest total power first; nullopt when none does or two of one power do.
std::optional<std::string> SizeProduct(int64_t a, int64_t b, const SizeBindings& sizes_a,
                                       const SizeBindings& sizes_b) {
  std::vector<std::string> names;
  for (const auto& [name, value] : sizes_a) {
    if (sizes_b.count(name)) names.push_back(name);
  }
  const size_t n = names.size();
  size_t combinations = 1;
  for (size_t i = 0; i < n; ++i) combinations *= 3;
  for (int degree = 1; degree <= 3; ++degree) {
    std::optional<std::string> found;
    for (size_t c = 0; c < combinations; ++c) {
      std::vector<int> power(n);
      int total = 0;
      for (size_t i = 0, r = c; i < n; ++i, r /= 3) total += power[i] = static_cast<int>(r % 3);
      if (total != degree) continue;
      __int128 pa = 1, pb = 1;
      std::string expr;
      for (size_t i = 0; i < n; ++i) {
        for (int k = 0; k < power[i]; ++k) {
          pa *= sizes_a.find(names[i])->second;
          pb *= sizes_b.find(names[i])->second;
          expr += (expr.empty() ? "" : "*") + names[i];
        }
      }
      if (pa == 0 || pb == 0 || a % pa != 0 || b % pb != 0) continue;
      const __int128 factor = a / pa;
      if (factor == 0 || factor != b / pb) continue;
      if (found) return std::nullopt;  // two products of one degree: the bindings cannot tell
      found = factor == 1 ? expr : fmt::format("{}*{}", static_cast<int64_t>(factor), expr);
    }
    if (found) return found;
  }
  return std::nullopt;
}

}  // namespace

std::string GeneraliseSizes(std::string_view text_a, const SizeBindings& sizes_a,
                            std::string_view text_b, const SizeBindings& sizes_b) {
  Lexer la(text_a, "a"), lb(text_b, "b");
  std::string out;
  size_t copied = 0;  // text_a[0, copied) is in out
  for (;;) {
    const Token ta = la.Next(), tb = lb.Next();
    if (ta.kind != tb.kind || (ta.kind != TokenKind::kInt && ta.raw != tb.raw)) {
      throw InvalidArgument(fmt::format(
          "line {}: the program differs between sizes in more than numbers ({} against {})",
          ta.line, Describe(ta), Describe(tb)));
    }
    if (ta.kind == TokenKind::kEnd) break;
    if (ta.kind != TokenKind::kInt || ta.int_value == tb.int_value) continue;
    std::optional<std::string> expr = SizeProduct(ta.int_value, tb.int_value, sizes_a, sizes_b);
    if (!expr) {
      throw InvalidArgument(
          fmt::format("line {}: {} becomes {} at other sizes, which no product of the sizes gives",
                      ta.line, ta.int_value, tb.int_value));
    }
    const auto at = static_cast<size_t>(ta.raw.data() - text_a.data());
    out.append(text_a.substr(copied, at - copied));
    out += *expr;
    copied = at + ta.raw.size();
  }
  out.append(text_a.substr(copied));
  return out;
}

}  // namespace sluice
