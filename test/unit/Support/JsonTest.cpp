#include "dflex/Support/Json.h"

#include <gtest/gtest.h>

using namespace dflex;

namespace {

JsonValue sampleManifest() {
  JsonValue kernel;
  kernel["name"] = "attn_fwd";
  kernel["shared_bytes"] = uint64_t(101376);
  kernel["scale"] = 0.125;
  kernel["gqa"] = true;
  kernel["note"] = JsonValue();
  kernel["archs"].push("sm_90");
  kernel["archs"].push("sm_120");
  JsonValue manifest;
  manifest["version"] = 1;
  manifest["kernels"].push(kernel);
  manifest["empty_list"] = JsonValue::array();
  manifest["empty_map"] = JsonValue::object();
  manifest["text"] = "quote \" backslash \\ newline \n tab \t bell \x07 é";
  manifest["negative"] = int64_t(-9007199254740993);
  manifest["whole_double"] = 2.0;
  return manifest;
}

TEST(Json, PrettyOutputIsStableAndSorted) {
  EXPECT_EQ(writeJson(sampleManifest()),
            "{\n"
            "  \"empty_list\": [],\n"
            "  \"empty_map\": {},\n"
            "  \"kernels\": [\n"
            "    {\n"
            "      \"archs\": [\n"
            "        \"sm_90\",\n"
            "        \"sm_120\"\n"
            "      ],\n"
            "      \"gqa\": true,\n"
            "      \"name\": \"attn_fwd\",\n"
            "      \"note\": null,\n"
            "      \"scale\": 0.125,\n"
            "      \"shared_bytes\": 101376\n"
            "    }\n"
            "  ],\n"
            "  \"negative\": -9007199254740993,\n"
            "  \"text\": \"quote \\\" backslash \\\\ newline \\n tab \\t bell "
            "\\u0007 é\",\n"
            "  \"version\": 1,\n"
            "  \"whole_double\": 2.0\n"
            "}\n");
  EXPECT_EQ(writeJson(JsonValue::Array{1, "a"}, 0), "[1,\"a\"]");
}

TEST(Json, RoundTripKeepsValuesAndKinds) {
  JsonValue manifest = sampleManifest();
  for (int indent : {0, 2, 4}) {
    Result<JsonValue> parsed = parseJson(writeJson(manifest, indent));
    ASSERT_TRUE(parsed.ok()) << parsed.error();
    EXPECT_EQ(parsed.value(), manifest);
  }
  Result<JsonValue> parsed = parseJson(writeJson(manifest));
  ASSERT_TRUE(parsed.ok());
  const JsonValue &value = parsed.value();
  EXPECT_TRUE(value.find("whole_double")->kind() == JsonValue::Kind::Number);
  EXPECT_EQ(value.find("negative")->asInteger(), -9007199254740993);
  EXPECT_EQ(value.find("kernels")->asArray()[0].find("shared_bytes")->asInteger(),
            101376);
  EXPECT_EQ(value.find("missing"), nullptr);
}

TEST(Json, DoublesRoundTripExactly) {
  for (double number : {0.1, 1e-300, 1.7976931348623157e308, -3.25, 1e21}) {
    Result<JsonValue> parsed = parseJson(writeJson(JsonValue(number), 0));
    ASSERT_TRUE(parsed.ok()) << parsed.error();
    EXPECT_EQ(parsed.value().asNumber(), number);
  }
  EXPECT_EQ(writeJson(JsonValue(std::numeric_limits<double>::infinity()), 0),
            "null");
}

TEST(Json, ParsesEscapesAndUnicode) {
  Result<JsonValue> parsed =
      parseJson(R"(["\u00e9\u4e2d\ud83d\ude00", "a\/b", "\b\f\r"])");
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  const JsonValue::Array &items = parsed.value().asArray();
  EXPECT_EQ(items[0].asString(), "é中😀");
  EXPECT_EQ(items[1].asString(), "a/b");
  EXPECT_EQ(items[2].asString(), "\b\f\r");
}

TEST(Json, LargeIntegersBecomeDoubles) {
  Result<JsonValue> parsed = parseJson("[9223372036854775807, "
                                       "9223372036854775808]");
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed.value().asArray()[0].isInteger());
  EXPECT_EQ(parsed.value().asArray()[0].asInteger(), INT64_MAX);
  EXPECT_EQ(parsed.value().asArray()[1].kind(), JsonValue::Kind::Number);
}

struct BadJson {
  const char *text;
  const char *error;
};

void PrintTo(const BadJson &bad, std::ostream *out) {
  *out << ::testing::PrintToString(std::string(bad.text));
}

class JsonErrors : public ::testing::TestWithParam<BadJson> {};

TEST_P(JsonErrors, ReportLineAndColumn) {
  Result<JsonValue> parsed = parseJson(GetParam().text, "manifest.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error(), GetParam().error);
}

INSTANTIATE_TEST_SUITE_P(
    Strict, JsonErrors,
    ::testing::Values(
        BadJson{"", "manifest.json:1:1: unexpected end of input, expected a "
                    "value"},
        BadJson{"{\n  \"a\": 1,\n  \"b\": [1, 2,]\n}",
                "manifest.json:3:13: trailing ',' before ']'"},
        BadJson{"{\"a\": 1,}", "manifest.json:1:8: trailing ',' before '}'"},
        BadJson{"{\n\"a\": 1,\n\"a\": 2}",
                "manifest.json:3:1: duplicate key \"a\""},
        BadJson{"{\"a\" 1}",
                "manifest.json:1:6: unexpected '1', expected ':' after the "
                "key"},
        BadJson{"[1 2]",
                "manifest.json:1:4: unexpected '2' in array, expected ',' or "
                "']'"},
        BadJson{"{a: 1}",
                "manifest.json:1:2: unexpected 'a' in object, expected a "
                "string key"},
        BadJson{"[01]", "manifest.json:1:2: invalid number: leading zero"},
        BadJson{"[1.]",
                "manifest.json:1:4: invalid number: expected a digit after "
                "'.'"},
        BadJson{"[-]", "manifest.json:1:3: invalid number: expected a digit"},
        BadJson{"1e400", "manifest.json:1:1: number out of range"},
        BadJson{"[tru]", "manifest.json:1:2: invalid literal, expected 'true'"},
        BadJson{"\"abc", "manifest.json:1:5: unterminated string"},
        BadJson{"\"a\tb\"",
                "manifest.json:1:3: unescaped control character \\x09 in "
                "string"},
        BadJson{"\"\\x\"", "manifest.json:1:2: invalid escape '\\x' in string"},
        BadJson{"\"\\ud800\"",
                "manifest.json:1:2: unpaired high surrogate in \\u escape"},
        BadJson{"\"\\udc00\"",
                "manifest.json:1:2: unpaired low surrogate in \\u escape"},
        BadJson{"\"\\u12g4\"",
                "manifest.json:1:6: invalid hex digit 'g' in \\u escape"},
        BadJson{"\"\xc3\x28\"",
                "manifest.json:1:2: invalid UTF-8 sequence in string"},
        BadJson{"\"\xc0\xaf\"",
                "manifest.json:1:2: invalid UTF-8 byte \\xc0 in string"},
        BadJson{"\"\xed\xa0\x80\"",
                "manifest.json:1:2: invalid UTF-8 sequence in string"},
        BadJson{"\xef\xbb\xbf{}",
                "manifest.json:1:1: unexpected '\\xef', expected a value"},
        BadJson{"{} {}",
                "manifest.json:1:4: unexpected '{' after the JSON value"},
        BadJson{"// comment\n{}",
                "manifest.json:1:1: unexpected '/', expected a value"},
        BadJson{"NaN", "manifest.json:1:1: unexpected 'N', expected a value"}));

TEST(Json, NestingDepthIsLimited) {
  std::string deep(300, '[');
  Result<JsonValue> parsed = parseJson(deep);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error(), "<json>:1:257: nesting deeper than 256");
  std::string fine = std::string(200, '[') + std::string(200, ']');
  EXPECT_TRUE(parseJson(fine).ok());
}

} // namespace
