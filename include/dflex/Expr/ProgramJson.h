//===- ProgramJson.h - programs in bundle manifests -------------*- C++ -*-===//

#ifndef DFLEX_EXPR_PROGRAMJSON_H
#define DFLEX_EXPR_PROGRAMJSON_H

#include "dflex/Expr/Program.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Status.h"

namespace dflex::expr {

/// The number of operands instructions with opcode `op` take (Read: its
/// tensor's rank, given as `readRank`).
int operandCount(Opcode op, int readRank);

JsonValue toJson(const Program &program);

/// Reads a program back, checking everything evaluation relies on (known
/// opcodes and types, operand counts, operands defined before use, capture
/// references, the result), so a damaged manifest is an error, not a crash.
Result<Program> programFromJson(const JsonValue &json);

} // namespace dflex::expr

#endif // DFLEX_EXPR_PROGRAMJSON_H
