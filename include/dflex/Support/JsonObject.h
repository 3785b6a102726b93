//===- JsonObject.h - Typed reads of JSON members -----------------*- C++ -*-===//
//
// Reads of JSON object members whose errors name the file and the key path,
// e.g. "config.json: text_config: num_hidden_layers: expected an integer".
// They throw FormatError (IoError for unreadable files): for the runtime and
// for library implementations that catch it at their public functions.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_SUPPORT_JSONOBJECT_H
#define DFLEX_SUPPORT_JSONOBJECT_H

#include "dflex/Support/Json.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflex {

/// Parses JSON text; throws FormatError with the parser's position.
JsonValue parseJsonText(std::string_view text, const std::string &source);
/// Reads and parses a JSON file; IoError if unreadable, FormatError if bad.
JsonValue readJsonFile(const std::string &path);

class JsonObject {
public:
  /// `where` names the object in errors ("config.json", "x.json: text_config").
  /// Throws FormatError unless `value` is an object.
  JsonObject(const JsonValue &value, std::string where);

  const std::string &where() const { return where_; }
  const JsonValue::Object &members() const { return value_->asObject(); }
  bool has(std::string_view key) const;
  /// Present and not null.
  bool hasValue(std::string_view key) const;

  int64_t integer(std::string_view key) const;
  std::optional<int64_t> optionalInteger(std::string_view key) const;
  double number(std::string_view key) const;
  std::optional<double> optionalNumber(std::string_view key) const;
  bool boolean(std::string_view key, bool absent) const;
  const std::string &string(std::string_view key) const;
  std::optional<std::string> optionalString(std::string_view key) const;
  std::vector<int64_t> integers(std::string_view key) const;
  std::vector<std::string> strings(std::string_view key) const;
  JsonObject object(std::string_view key) const;
  std::optional<JsonObject> optionalObject(std::string_view key) const;

  /// Throws FormatError "<where>: <key>: <problem>".
  [[noreturn]] void fail(std::string_view key, const std::string &problem) const;

private:
  const JsonValue &require(std::string_view key) const;

  const JsonValue *value_;
  std::string where_;
};

} // namespace dflex

#endif // DFLEX_SUPPORT_JSONOBJECT_H
