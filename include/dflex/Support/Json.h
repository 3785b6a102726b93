//===- Json.h - A small JSON value, writer and strict parser ---------------===//
//
// The runtime has no LLVM, so bundle manifests are read and written with this.
// Objects keep their keys sorted, so writing is deterministic: the same value
// always produces the same bytes. Integers and non-integral numbers are kept
// apart so that byte sizes and offsets round-trip exactly.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_SUPPORT_JSON_H
#define DFLEX_SUPPORT_JSON_H

#include "dflex/Support/Status.h"

#include <cassert>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dflex {

class JsonValue {
public:
  enum class Kind { Null, Bool, Integer, Number, String, Array, Object };
  using Array = std::vector<JsonValue>;
  using Object = std::map<std::string, JsonValue>;

  JsonValue() = default;
  JsonValue(std::nullptr_t) {}
  JsonValue(bool value) : storage_(value) {}
  JsonValue(int value) : storage_(int64_t(value)) {}
  JsonValue(int64_t value) : storage_(value) {}
  JsonValue(uint32_t value) : storage_(int64_t(value)) {}
  /// Sizes and offsets; values above INT64_MAX are a bug (checked by assert).
  JsonValue(uint64_t value) : storage_(int64_t(value)) {
    assert(value <= uint64_t(INT64_MAX));
  }
  JsonValue(double value) : storage_(value) {}
  JsonValue(const char *value) : storage_(std::string(value)) {}
  JsonValue(std::string value) : storage_(std::move(value)) {}
  JsonValue(std::string_view value) : storage_(std::string(value)) {}
  JsonValue(Array value) : storage_(std::move(value)) {}
  JsonValue(Object value) : storage_(std::move(value)) {}

  static JsonValue array() { return JsonValue(Array()); }
  static JsonValue object() { return JsonValue(Object()); }

  Kind kind() const { return static_cast<Kind>(storage_.index()); }
  bool isNull() const { return kind() == Kind::Null; }
  bool isBool() const { return kind() == Kind::Bool; }
  bool isInteger() const { return kind() == Kind::Integer; }
  /// True for integers and non-integral numbers alike.
  bool isNumber() const {
    return kind() == Kind::Integer || kind() == Kind::Number;
  }
  bool isString() const { return kind() == Kind::String; }
  bool isArray() const { return kind() == Kind::Array; }
  bool isObject() const { return kind() == Kind::Object; }

  // Accessors require the matching kind (checked by assert); test with isX()
  // first when the value comes from outside.
  bool asBool() const { return std::get<bool>(checked(Kind::Bool)); }
  int64_t asInteger() const {
    return std::get<int64_t>(checked(Kind::Integer));
  }
  /// Any number as a double.
  double asNumber() const;
  const std::string &asString() const {
    return std::get<std::string>(checked(Kind::String));
  }
  const Array &asArray() const {
    return std::get<Array>(checked(Kind::Array));
  }
  Array &asArray() { return std::get<Array>(checked(Kind::Array)); }
  const Object &asObject() const {
    return std::get<Object>(checked(Kind::Object));
  }
  Object &asObject() { return std::get<Object>(checked(Kind::Object)); }

  /// Member `key` of an object, or null if absent (or this is no object).
  const JsonValue *find(std::string_view key) const;
  /// Member `key` of an object, inserted as null if absent; a null value
  /// becomes an empty object first.
  JsonValue &operator[](const std::string &key);
  /// Appends to an array; a null value becomes an empty array first.
  void push(JsonValue value);

  bool operator==(const JsonValue &other) const {
    return storage_ == other.storage_;
  }
  bool operator!=(const JsonValue &other) const { return !(*this == other); }

private:
  using Storage = std::variant<std::nullptr_t, bool, int64_t, double,
                               std::string, Array, Object>;
  const Storage &checked(Kind expected) const;
  Storage &checked(Kind expected);

  Storage storage_;
};

/// Writes `value` as JSON. indent > 0 puts one member or element per line,
/// indented by that many spaces per level, and ends with a newline; indent 0
/// writes one line without spaces. Strings are written as UTF-8 with control
/// characters, quote and backslash escaped. Non-finite numbers, which JSON
/// cannot represent, are written as null.
std::string writeJson(const JsonValue &value, int indent = 2);

/// Parses exactly one JSON text (RFC 8259): no comments, no trailing commas,
/// no duplicate keys, valid UTF-8 only. Errors read
/// "<sourceName>:<line>:<column>: <message>" (line and column start at 1,
/// columns count bytes).
Result<JsonValue> parseJson(std::string_view text,
                            std::string_view sourceName = "<json>");

} // namespace dflex

#endif // DFLEX_SUPPORT_JSON_H
