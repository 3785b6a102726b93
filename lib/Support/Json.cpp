//===- Json.cpp - JSON writer and strict parser -----------------------------===//
#include "dflex/Support/Json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace dflex {

//===----------------------------------------------------------------------===//
// JsonValue
//===----------------------------------------------------------------------===//

const JsonValue::Storage &JsonValue::checked(Kind expected) const {
  assert(kind() == expected && "JSON value accessed as the wrong kind");
  (void)expected;
  return storage_;
}

JsonValue::Storage &JsonValue::checked(Kind expected) {
  assert(kind() == expected && "JSON value accessed as the wrong kind");
  (void)expected;
  return storage_;
}

double JsonValue::asNumber() const {
  if (isInteger())
    return double(std::get<int64_t>(storage_));
  return std::get<double>(checked(Kind::Number));
}

const JsonValue *JsonValue::find(std::string_view key) const {
  if (!isObject())
    return nullptr;
  const Object &members = std::get<Object>(storage_);
  auto it = members.find(std::string(key));
  return it == members.end() ? nullptr : &it->second;
}

JsonValue &JsonValue::operator[](const std::string &key) {
  if (isNull())
    storage_ = Object();
  return asObject()[key];
}

void JsonValue::push(JsonValue value) {
  if (isNull())
    storage_ = Array();
  asArray().push_back(std::move(value));
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

namespace {

void writeString(std::string &out, std::string_view text) {
  out.push_back('"');
  for (unsigned char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        char escape[8];
        std::snprintf(escape, sizeof(escape), "\\u%04x", c);
        out += escape;
      } else {
        out.push_back(char(c));
      }
    }
  }
  out.push_back('"');
}

void writeNumber(std::string &out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  // Shortest text that reads back as the same double.
  char text[64];
  auto [end, ec] = std::to_chars(text, text + sizeof(text), value);
  (void)ec;
  std::string_view written(text, end - text);
  out += written;
  // Keep a non-integral kind on re-reading: 2.0 must not come back as 2.
  if (written.find_first_of(".eE") == std::string_view::npos)
    out += ".0";
}

class Writer {
public:
  explicit Writer(int indent) : indent_(indent) {}

  void write(const JsonValue &value, int depth) {
    switch (value.kind()) {
    case JsonValue::Kind::Null:
      out_ += "null";
      return;
    case JsonValue::Kind::Bool:
      out_ += value.asBool() ? "true" : "false";
      return;
    case JsonValue::Kind::Integer:
      out_ += std::to_string(value.asInteger());
      return;
    case JsonValue::Kind::Number:
      writeNumber(out_, value.asNumber());
      return;
    case JsonValue::Kind::String:
      writeString(out_, value.asString());
      return;
    case JsonValue::Kind::Array: {
      const JsonValue::Array &elements = value.asArray();
      if (elements.empty()) {
        out_ += "[]";
        return;
      }
      out_.push_back('[');
      for (size_t i = 0; i < elements.size(); ++i) {
        if (i > 0)
          out_.push_back(',');
        newline(depth + 1);
        write(elements[i], depth + 1);
      }
      newline(depth);
      out_.push_back(']');
      return;
    }
    case JsonValue::Kind::Object: {
      const JsonValue::Object &members = value.asObject();
      if (members.empty()) {
        out_ += "{}";
        return;
      }
      out_.push_back('{');
      bool first = true;
      for (const auto &[key, member] : members) {
        if (!first)
          out_.push_back(',');
        first = false;
        newline(depth + 1);
        writeString(out_, key);
        out_ += indent_ > 0 ? ": " : ":";
        write(member, depth + 1);
      }
      newline(depth);
      out_.push_back('}');
      return;
    }
    }
  }

  std::string take() {
    if (indent_ > 0)
      out_.push_back('\n');
    return std::move(out_);
  }

private:
  void newline(int depth) {
    if (indent_ <= 0)
      return;
    out_.push_back('\n');
    out_.append(size_t(depth) * size_t(indent_), ' ');
  }

  int indent_;
  std::string out_;
};

} // namespace

std::string writeJson(const JsonValue &value, int indent) {
  Writer writer(indent);
  writer.write(value, 0);
  return writer.take();
}

//===----------------------------------------------------------------------===//
// Parser
//===----------------------------------------------------------------------===//

namespace {

// Deep enough for any manifest, shallow enough that recursion cannot
// overflow the stack on hostile input.
constexpr int kMaxDepth = 256;

class Parser {
public:
  Parser(std::string_view text, std::string_view sourceName)
      : text_(text), sourceName_(sourceName) {}

  Result<JsonValue> parseDocument() {
    JsonValue value;
    skipWhitespace();
    if (!parseValue(value, 0))
      return Result<JsonValue>::failure(error_);
    skipWhitespace();
    if (pos_ != text_.size()) {
      fail("unexpected '" + describe(text_[pos_]) + "' after the JSON value");
      return Result<JsonValue>::failure(error_);
    }
    return value;
  }

private:
  static std::string describe(char c) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char text[8];
      std::snprintf(text, sizeof(text), "\\x%02x", u);
      return text;
    }
    return std::string(1, c);
  }

  // Reports at `at` (default: the current position); returns false so that
  // callers can `return fail(...)`.
  bool fail(const std::string &message, size_t at = std::string_view::npos) {
    if (at == std::string_view::npos)
      at = pos_;
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    error_ = std::string(sourceName_) + ":" + std::to_string(line) + ":" +
             std::to_string(column) + ": " + message;
    return false;
  }

  void skipWhitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool atEnd() const { return pos_ >= text_.size(); }

  bool parseValue(JsonValue &value, int depth) {
    if (atEnd())
      return fail("unexpected end of input, expected a value");
    char c = text_[pos_];
    switch (c) {
    case '{':
      return parseObject(value, depth);
    case '[':
      return parseArray(value, depth);
    case '"': {
      std::string text;
      if (!parseString(text))
        return false;
      value = JsonValue(std::move(text));
      return true;
    }
    case 't':
      return parseLiteral("true", JsonValue(true), value);
    case 'f':
      return parseLiteral("false", JsonValue(false), value);
    case 'n':
      return parseLiteral("null", JsonValue(), value);
    default:
      if (c == '-' || (c >= '0' && c <= '9'))
        return parseNumber(value);
      return fail("unexpected '" + describe(c) + "', expected a value");
    }
  }

  bool parseLiteral(std::string_view word, JsonValue literal,
                    JsonValue &value) {
    if (text_.substr(pos_, word.size()) != word)
      return fail("invalid literal, expected '" + std::string(word) + "'");
    pos_ += word.size();
    value = std::move(literal);
    return true;
  }

  bool parseObject(JsonValue &value, int depth) {
    if (depth >= kMaxDepth)
      return fail("nesting deeper than " + std::to_string(kMaxDepth));
    ++pos_; // '{'
    JsonValue::Object members;
    skipWhitespace();
    if (!atEnd() && text_[pos_] == '}') {
      ++pos_;
      value = JsonValue(std::move(members));
      return true;
    }
    while (true) {
      skipWhitespace();
      if (atEnd())
        return fail("unexpected end of input in object, expected a key");
      if (text_[pos_] != '"')
        return fail("unexpected '" + describe(text_[pos_]) +
                    "' in object, expected a string key");
      size_t keyStart = pos_;
      std::string key;
      if (!parseString(key))
        return false;
      if (members.count(key))
        return fail("duplicate key \"" + key + "\"", keyStart);
      skipWhitespace();
      if (atEnd() || text_[pos_] != ':')
        return fail(atEnd() ? "unexpected end of input, expected ':'"
                            : "unexpected '" + describe(text_[pos_]) +
                                  "', expected ':' after the key");
      ++pos_;
      skipWhitespace();
      JsonValue member;
      if (!parseValue(member, depth + 1))
        return false;
      members.emplace(std::move(key), std::move(member));
      skipWhitespace();
      if (atEnd())
        return fail("unexpected end of input in object, expected ',' or '}'");
      if (text_[pos_] == '}') {
        ++pos_;
        value = JsonValue(std::move(members));
        return true;
      }
      if (text_[pos_] != ',')
        return fail("unexpected '" + describe(text_[pos_]) +
                    "' in object, expected ',' or '}'");
      size_t comma = pos_++;
      skipWhitespace();
      if (!atEnd() && text_[pos_] == '}')
        return fail("trailing ',' before '}'", comma);
    }
  }

  bool parseArray(JsonValue &value, int depth) {
    if (depth >= kMaxDepth)
      return fail("nesting deeper than " + std::to_string(kMaxDepth));
    ++pos_; // '['
    JsonValue::Array elements;
    skipWhitespace();
    if (!atEnd() && text_[pos_] == ']') {
      ++pos_;
      value = JsonValue(std::move(elements));
      return true;
    }
    while (true) {
      skipWhitespace();
      JsonValue element;
      if (!parseValue(element, depth + 1))
        return false;
      elements.push_back(std::move(element));
      skipWhitespace();
      if (atEnd())
        return fail("unexpected end of input in array, expected ',' or ']'");
      if (text_[pos_] == ']') {
        ++pos_;
        value = JsonValue(std::move(elements));
        return true;
      }
      if (text_[pos_] != ',')
        return fail("unexpected '" + describe(text_[pos_]) +
                    "' in array, expected ',' or ']'");
      size_t comma = pos_++;
      skipWhitespace();
      if (!atEnd() && text_[pos_] == ']')
        return fail("trailing ',' before ']'", comma);
    }
  }

  bool parseHex4(uint32_t &code) {
    if (text_.size() - pos_ < 4)
      return fail("unexpected end of input in \\u escape");
    code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_];
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
      if (digit < 0)
        return fail("invalid hex digit '" + describe(c) + "' in \\u escape");
      code = code << 4 | uint32_t(digit);
      ++pos_;
    }
    return true;
  }

  static void appendUtf8(std::string &out, uint32_t code) {
    if (code < 0x80) {
      out.push_back(char(code));
    } else if (code < 0x800) {
      out.push_back(char(0xc0 | code >> 6));
      out.push_back(char(0x80 | (code & 0x3f)));
    } else if (code < 0x10000) {
      out.push_back(char(0xe0 | code >> 12));
      out.push_back(char(0x80 | (code >> 6 & 0x3f)));
      out.push_back(char(0x80 | (code & 0x3f)));
    } else {
      out.push_back(char(0xf0 | code >> 18));
      out.push_back(char(0x80 | (code >> 12 & 0x3f)));
      out.push_back(char(0x80 | (code >> 6 & 0x3f)));
      out.push_back(char(0x80 | (code & 0x3f)));
    }
  }

  // Consumes one UTF-8 encoded character (RFC 3629: shortest form, no
  // surrogates, at most U+10FFFF) and appends it.
  bool copyUtf8(std::string &out) {
    size_t start = pos_;
    unsigned char lead = static_cast<unsigned char>(text_[pos_]);
    size_t length;
    uint32_t code, minimum;
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2, code = lead & 0x1f, minimum = 0x80;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3, code = lead & 0x0f, minimum = 0x800;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4, code = lead & 0x07, minimum = 0x10000;
    } else {
      return fail("invalid UTF-8 byte " + describe(char(lead)) + " in string");
    }
    if (text_.size() - pos_ < length)
      return fail("truncated UTF-8 sequence in string");
    for (size_t i = 1; i < length; ++i) {
      unsigned char next = static_cast<unsigned char>(text_[pos_ + i]);
      if ((next & 0xc0) != 0x80)
        return fail("invalid UTF-8 sequence in string");
      code = code << 6 | (next & 0x3f);
    }
    if (code < minimum || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
      return fail("invalid UTF-8 sequence in string");
    out.append(text_.substr(start, length));
    pos_ += length;
    return true;
  }

  bool parseString(std::string &out) {
    ++pos_; // opening quote
    while (true) {
      if (atEnd())
        return fail("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("unescaped control character " + describe(c) +
                    " in string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        if (!copyUtf8(out))
          return false;
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      size_t escapeStart = pos_;
      ++pos_;
      if (atEnd())
        return fail("unterminated string");
      char escape = text_[pos_++];
      switch (escape) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        uint32_t code;
        if (!parseHex4(code))
          return false;
        if (code >= 0xdc00 && code <= 0xdfff)
          return fail("unpaired low surrogate in \\u escape", escapeStart);
        if (code >= 0xd800 && code <= 0xdbff) {
          if (text_.substr(pos_, 2) != "\\u")
            return fail("unpaired high surrogate in \\u escape", escapeStart);
          pos_ += 2;
          uint32_t low;
          if (!parseHex4(low))
            return false;
          if (low < 0xdc00 || low > 0xdfff)
            return fail("high surrogate not followed by a low surrogate",
                        escapeStart);
          code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        }
        appendUtf8(out, code);
        break;
      }
      default:
        return fail("invalid escape '\\" + describe(escape) + "' in string",
                    escapeStart);
      }
    }
  }

  bool parseNumber(JsonValue &value) {
    size_t start = pos_;
    auto digits = [&] {
      size_t first = pos_;
      while (!atEnd() && text_[pos_] >= '0' && text_[pos_] <= '9')
        ++pos_;
      return pos_ - first;
    };
    if (text_[pos_] == '-')
      ++pos_;
    if (atEnd() || !(text_[pos_] >= '0' && text_[pos_] <= '9'))
      return fail("invalid number: expected a digit");
    if (text_[pos_] == '0') {
      ++pos_;
      if (!atEnd() && text_[pos_] >= '0' && text_[pos_] <= '9')
        return fail("invalid number: leading zero", start);
    } else {
      digits();
    }
    bool integral = true;
    if (!atEnd() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0)
        return fail("invalid number: expected a digit after '.'");
    }
    if (!atEnd() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (!atEnd() && (text_[pos_] == '+' || text_[pos_] == '-'))
        ++pos_;
      if (digits() == 0)
        return fail("invalid number: expected a digit in the exponent");
    }
    const char *first = text_.data() + start;
    const char *last = text_.data() + pos_;
    if (integral) {
      int64_t integer;
      auto [end, ec] = std::from_chars(first, last, integer);
      if (ec == std::errc() && end == last) {
        value = JsonValue(integer);
        return true;
      }
      // Too large for int64: keep it as a double rather than refusing it.
    }
    double number;
    auto [end, ec] = std::from_chars(first, last, number);
    if (ec == std::errc::result_out_of_range)
      return fail("number out of range", start);
    if (ec != std::errc() || end != last)
      return fail("invalid number", start);
    value = JsonValue(number);
    return true;
  }

  std::string_view text_;
  std::string_view sourceName_;
  size_t pos_ = 0;
  std::string error_;
};

} // namespace

Result<JsonValue> parseJson(std::string_view text,
                            std::string_view sourceName) {
  return Parser(text, sourceName).parseDocument();
}

} // namespace dflex
