//===- JsonObject.cpp - Typed reads of JSON members -----------------------===//

#include "dflex/Support/JsonObject.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/File.h"

namespace dflex {

JsonValue parseJsonText(std::string_view text, const std::string &source) {
  Result<JsonValue> parsed = parseJson(text, source);
  if (!parsed.ok())
    throw FormatError(parsed.error());
  return std::move(parsed).value();
}

JsonValue readJsonFile(const std::string &path) {
  Result<std::string> text = readFile(path);
  if (!text.ok())
    throw IoError(text.error());
  return parseJsonText(text.value(), path);
}

JsonObject::JsonObject(const JsonValue &value, std::string where)
    : value_(&value), where_(std::move(where)) {
  if (!value.isObject())
    throw FormatError(where_ + ": expected a JSON object");
}

void JsonObject::fail(std::string_view key, const std::string &problem) const {
  throw FormatError(where_ + ": " + std::string(key) + ": " + problem);
}

bool JsonObject::has(std::string_view key) const {
  return value_->find(key) != nullptr;
}

bool JsonObject::hasValue(std::string_view key) const {
  const JsonValue *member = value_->find(key);
  return member && !member->isNull();
}

const JsonValue &JsonObject::require(std::string_view key) const {
  const JsonValue *member = value_->find(key);
  if (!member || member->isNull())
    fail(key, "missing");
  return *member;
}

int64_t JsonObject::integer(std::string_view key) const {
  const JsonValue &member = require(key);
  if (!member.isInteger())
    fail(key, "expected an integer");
  return member.asInteger();
}

std::optional<int64_t> JsonObject::optionalInteger(std::string_view key) const {
  if (!hasValue(key))
    return std::nullopt;
  return integer(key);
}

double JsonObject::number(std::string_view key) const {
  const JsonValue &member = require(key);
  if (!member.isNumber())
    fail(key, "expected a number");
  return member.asNumber();
}

std::optional<double> JsonObject::optionalNumber(std::string_view key) const {
  if (!hasValue(key))
    return std::nullopt;
  return number(key);
}

bool JsonObject::boolean(std::string_view key, bool absent) const {
  if (!hasValue(key))
    return absent;
  const JsonValue &member = require(key);
  if (!member.isBool())
    fail(key, "expected true or false");
  return member.asBool();
}

const std::string &JsonObject::string(std::string_view key) const {
  const JsonValue &member = require(key);
  if (!member.isString())
    fail(key, "expected a string");
  return member.asString();
}

std::optional<std::string>
JsonObject::optionalString(std::string_view key) const {
  if (!hasValue(key))
    return std::nullopt;
  return string(key);
}

std::vector<int64_t> JsonObject::integers(std::string_view key) const {
  const JsonValue &member = require(key);
  if (!member.isArray())
    fail(key, "expected an array of integers");
  std::vector<int64_t> values;
  for (const JsonValue &element : member.asArray()) {
    if (!element.isInteger())
      fail(key, "expected an array of integers");
    values.push_back(element.asInteger());
  }
  return values;
}

std::vector<std::string> JsonObject::strings(std::string_view key) const {
  const JsonValue &member = require(key);
  if (!member.isArray())
    fail(key, "expected an array of strings");
  std::vector<std::string> values;
  for (const JsonValue &element : member.asArray()) {
    if (!element.isString())
      fail(key, "expected an array of strings");
    values.push_back(element.asString());
  }
  return values;
}

JsonObject JsonObject::object(std::string_view key) const {
  const JsonValue &member = require(key);
  if (!member.isObject())
    fail(key, "expected an object");
  return JsonObject(member, where_ + ": " + std::string(key));
}

std::optional<JsonObject>
JsonObject::optionalObject(std::string_view key) const {
  if (!hasValue(key))
    return std::nullopt;
  return object(key);
}

} // namespace dflex
