//===- InputLimits.cpp - reject inputs the parser cannot take safely ------===//

#include "dflex/Support/InputLimits.h"

#include <cctype>

namespace dflex {

std::optional<InputProblem> checkInputLimits(std::string_view text,
                                             int maxDepth) {
  int depth = 0, line = 1, column = 1;
  for (size_t i = 0; i < text.size(); ++i, ++column) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      column = 0;
      continue;
    }
    if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i + 1 < text.size() && text[i + 1] != '\n')
        ++i;
      continue;
    }
    if (c == '"') {
      // Strings end at an unescaped quote or at the end of the line.
      for (++i, ++column; i < text.size() && text[i] != '"' && text[i] != '\n';
           ++i, ++column)
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
          ++i;
          ++column;
        }
      if (i < text.size() && text[i] == '\n')
        --i, --column; // let the loop count the newline
      continue;
    }
    bool startsNumber = std::isdigit(static_cast<unsigned char>(c)) &&
                        !(i > 0 && (std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                                    text[i - 1] == '_' || text[i - 1] == '.'));
    if (startsNumber) {
      size_t end = i;
      while (end < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '.'))
        ++end;
      if (end - i > static_cast<size_t>(kMaxNumberLength))
        return InputProblem{line, column,
                            "number literal longer than " +
                                std::to_string(kMaxNumberLength) + " characters"};
      column += static_cast<int>(end - i) - 1;
      i = end - 1;
      continue;
    }
    // '<' opens a level only right after a name (tensor<, dense<, #a.b<);
    // '>' of '->' closes nothing.
    bool opens = c == '(' || c == '[' || c == '{' ||
                 (c == '<' && i > 0 &&
                  (std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                   text[i - 1] == '_' || text[i - 1] == '<'));
    bool closes = c == ')' || c == ']' || c == '}' ||
                  (c == '>' && !(i > 0 && text[i - 1] == '-'));
    if (opens && ++depth > maxDepth)
      return InputProblem{line, column,
                          "brackets nest deeper than " +
                              std::to_string(maxDepth) + " levels"};
    if (closes && depth > 0)
      --depth;
  }
  return std::nullopt;
}

} // namespace dflex
