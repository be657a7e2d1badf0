#include "sluice/core/json_text.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

std::string Nested(int depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonTooDeepAt, FindsTheBracketThatOpensALevelPastTheBound) {
  EXPECT_EQ(JsonTooDeepAt("{\"a\": [1, {\"b\": 2}]}", 3), std::nullopt);
  EXPECT_EQ(JsonTooDeepAt("{\"a\": [1, {\"b\": 2}]}", 2), 10u);
  EXPECT_EQ(JsonTooDeepAt(Nested(kMaxJsonDepth)), std::nullopt);
  EXPECT_EQ(JsonTooDeepAt(Nested(kMaxJsonDepth + 1)), size_t{kMaxJsonDepth});
  // Siblings do not add up: depth is nesting, not a count of brackets.
  std::string siblings;
  for (int i = 0; i < 1000; ++i) siblings += "[[1]],";
  EXPECT_EQ(JsonTooDeepAt("[" + siblings + "0]", 3), std::nullopt);
}

TEST(JsonTooDeepAt, BracketsInsideStringsDoNotCount) {
  const std::string text = "[\"" + Nested(500) + "\", \"\\\"[[[[\"]";
  EXPECT_EQ(JsonTooDeepAt(text, 1), std::nullopt);
  // An escaped quote does not end the string; the one after it does.
  EXPECT_EQ(JsonTooDeepAt("[\"\\\"\", [[]]]", 2), 8u);
}

// Regression: 100000 '[' in a metrics line, a trace, a costs file or a checkpoint's config
// overflowed the stack when a message or the report page printed the value (nlohmann's dump
// recurses once per level): a segfault from a 200 KB file.
TEST(ParseJsonText, RefusesDeepNestingWithAParseErrorAtItsByte) {
  try {
    ParseJsonText("{\"step\": " + Nested(100000) + "}");
    FAIL() << "a 100000-level array was accepted";
  } catch (const nlohmann::json::parse_error& e) {
    EXPECT_EQ(e.id, 101);
    // The object is level 1, so the array's bracket 128 opens level 129; counted from 1.
    EXPECT_EQ(e.byte, 9u + kMaxJsonDepth);
    EXPECT_THAT(e.what(), HasSubstr("nesting deeper than 128 levels of arrays and objects"));
  }
  EXPECT_THROW(ParseJsonText(Nested(kMaxJsonDepth + 1, '{', '}')), nlohmann::json::parse_error);
}

TEST(ParseJsonText, ParsesWhatIsWithinTheBoundAsNlohmannDoes) {
  EXPECT_EQ(ParseJsonText("{\"a\": [1, 2.5, \"x\"]}"),
            nlohmann::json::parse("{\"a\": [1, 2.5, \"x\"]}"));
  EXPECT_TRUE(ParseJsonText(Nested(kMaxJsonDepth)).is_array());
  EXPECT_THROW(ParseJsonText("{\"a\": "), nlohmann::json::parse_error);
  // The callback sees every event, as nlohmann::json::parse's does.
  int keys = 0;
  ParseJsonText("{\"a\": 1, \"b\": {\"c\": 2}}",
                [&](int, nlohmann::json::parse_event_t event, nlohmann::json&) {
                  keys += event == nlohmann::json::parse_event_t::key;
                  return true;
                });
  EXPECT_EQ(keys, 3);
}

}  // namespace
}  // namespace sluice
