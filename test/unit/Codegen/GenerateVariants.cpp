//===- GenerateVariants.cpp - emit the examples' variants for a host test -===//
//
// Writes a header with the variant struct of every attention spec in the
// given files, each in its own namespace, and a table the test walks. The
// test compiles that header with the host compiler: the emitted functors are
// checked against the interpreter without a GPU.
//
//===----------------------------------------------------------------------===//

#include "DFlex/IR/DFlexDialect.h"
#include "DFlex/IR/DFlexOps.h"
#include "dflex/Codegen/Derivative.h"
#include "dflex/Codegen/Variant.h"
#include "dflex/Conversion/DFlexToProgram/DFlexToProgram.h"
#include "../RandomMasks.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <fstream>
#include <sstream>

using namespace mlir;

static FailureOr<::dflex::expr::Program> lower(Operation *spec, FlatSymbolRefAttr symbol) {
  auto body = SymbolTable::lookupNearestSymbolFrom<mlir::dflex::BodyOpInterface>(spec, symbol);
  auto program = mlir::dflex::lowerToProgram(body);
  if (succeeded(program) && program->isScoreMod &&
      !::dflex::codegen::appendScoreDerivative(*program).ok())
    return failure();
  return program;
}

// The test's entries to a variant's mask: through its row, column and pair
// parts, as the kernels' visibility evaluates it, and through its key
// intervals where it has them (else a null function).
static const char *const kMaskThroughItsParts =
    "inline bool mask(const void *v, long long b, long long h, long long q, long long kv) {\n"
    "  const ::dflex::kernels::MaskParts<Variant> parts{*static_cast<const Variant *>(v), b, h};\n"
    "  return parts.pair(parts.row(q), parts.column(kv));\n}\n"
    "constexpr MaskFunction keyIntervals = keyIntervalsOf<Variant>();\n";

// Once per header: the key-interval entry of a variant type.
static const char *const kKeyIntervalsOf =
    "using MaskFunction = bool (*)(const void *, long long, long long, long long, long long);\n"
    "template <class Variant> constexpr MaskFunction keyIntervalsOf() {\n"
    "  if constexpr (::dflex::kernels::HasKeyIntervals<Variant>::value)\n"
    "    return [](const void *v, long long b, long long h, long long q, long long kv) {\n"
    "      return ::dflex::kernels::in_key_intervals<Variant>(\n"
    "          static_cast<const Variant *>(v)->key_intervals(b, h, q), static_cast<int>(kv));\n"
    "    };\n"
    "  else\n"
    "    return nullptr;\n"
    "}\n\n";

int main(int argc, char **argv) {
  if (argc < 3) {
    llvm::errs() << "usage: generate-variants OUT.h FILE.mlir...\n";
    return 1;
  }
  DialectRegistry registry;
  registry.insert<mlir::dflex::DFlexDialect, arith::ArithDialect, math::MathDialect>();
  MLIRContext context(registry);
  std::ostringstream out, table;
  out << "// Generated for the codegen host test.\n#pragma once\n"
         "#include \"dflex/Expr/Semantics.h\"\n"
         "#define __host__\n#define __device__\n#define __forceinline__ inline\n"
         "#include \"analysis/tile_classify.cuh\"\n"
         "#include \"attention/variant.cuh\"\n\n"
      << kKeyIntervalsOf;
  table << "static const GeneratedVariant kGeneratedVariants[] = {\n";
  for (int i = 2; i < argc; ++i) {
    OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(argv[i], &context);
    if (!module)
      return 1;
    for (auto spec : module->getOps<mlir::dflex::AttentionOp>()) {
      auto mask = lower(spec, spec.getMaskAttr());
      std::optional<::dflex::expr::Program> scoreMod;
      if (spec.getScoreModAttr()) {
        auto lowered = lower(spec, spec.getScoreModAttr());
        if (failed(lowered))
          return 1;
        scoreMod = *lowered;
      }
      if (failed(mask))
        return 1;
      auto layout = ::dflex::codegen::layoutVariant(*mask, scoreMod ? &*scoreMod : nullptr);
      if (!layout.ok())
        return 1;
      std::string ns = "generated_" + ::dflex::codegen::sanitizeIdentifier(spec.getSymName().str());
      out << "namespace " << ns << " {\n"
          << ::dflex::codegen::emitVariant("Variant", layout.value(), *mask,
                                           scoreMod ? &*scoreMod : nullptr)
          << kMaskThroughItsParts <<
             "inline float scoreMod(const void *v, float s, long long b, long long h, long long q, long long kv) {\n"
             "  return static_cast<const Variant *>(v)->score_mod(s, b, h, q, kv);\n}\n"
             "inline float scoreModGrad(const void *v, float s, long long b, long long h, long long q, long long kv) {\n"
             "  return static_cast<const Variant *>(v)->score_mod_grad(s, b, h, q, kv);\n}\n"
             "inline int classifyTile(const void *v, int b, int h, int qTile, int kvTile, int qLen, int kvLen, int tileM, int tileN) {\n"
             "  return ::dflex::kernels::classify_tile_serial(*static_cast<const Variant *>(v),\n"
             "      ::dflex::kernels::TileCandidate{b, h, qTile, kvTile}, qLen, kvLen, tileM, tileN);\n}\n"
             "} // namespace " << ns << "\n\n";
      table << "    {\"" << argv[i] << "\", \"" << spec.getSymName().str() << "\", sizeof("
            << ns << "::Variant), " << ns << "::mask, " << ns << "::scoreMod, " << ns
            << "::scoreModGrad, " << ns << "::classifyTile, " << ns << "::keyIntervals},\n";
    }
  }
  table << "};\n";
  // Random bodies (RandomMasks.h), the same seeds the test draws.
  auto addRandom = [&](const char *tableName, const char *prefix, int count,
                       ::dflex::expr::Program (*draw)(uint64_t)) {
    table << "static const GeneratedRandomMask " << tableName << "[] = {\n";
    for (int seed = 0; seed < count; ++seed) {
      const ::dflex::expr::Program mask = draw(seed);
      auto layout = ::dflex::codegen::layoutVariant(mask, nullptr);
      if (!layout.ok())
        return false;
      const std::string ns = prefix + std::to_string(seed);
      out << "namespace " << ns << " {\n"
          << ::dflex::codegen::emitVariant("Variant", layout.value(), mask, nullptr) << kMaskThroughItsParts
          << "} // namespace " << ns << "\n\n";
      table << "    {" << seed << ", sizeof(" << ns << "::Variant), " << ns << "::mask, " << ns
            << "::keyIntervals},\n";
    }
    table << "};\n";
    return true;
  };
  if (!addRandom("kRandomVariants", "random_", ::dflex::test::kRandomMasks, ::dflex::test::randomMask) ||
      !addRandom("kRandomIntervalVariants", "random_interval_", ::dflex::test::kRandomIntervalMasks,
                 ::dflex::test::randomIntervalMask))
    return 1;
  // Random score_mods (RandomMasks.h) under the causal mask, entered through
  // their parts as LogitMap calls them.
  const ::dflex::expr::Program causal = ::dflex::test::causalMask();
  table << "static const GeneratedRandomScoreMod kRandomScoreModVariants[] = {\n";
  for (int seed = 0; seed < ::dflex::test::kRandomScoreMods; ++seed) {
    ::dflex::expr::Program scoreMod = ::dflex::test::randomScoreMod(seed);
    if (!::dflex::codegen::appendScoreDerivative(scoreMod).ok())
      return 1;
    auto layout = ::dflex::codegen::layoutVariant(causal, &scoreMod);
    if (!layout.ok())
      return 1;
    const std::string ns = "random_score_mod_" + std::to_string(seed);
    out << "namespace " << ns << " {\n"
        << ::dflex::codegen::emitVariant("Variant", layout.value(), causal, &scoreMod)
        << "inline float scoreMod(const void *v, float s, long long b, long long h, long long q, long long kv) {\n"
           "  const Variant &variant = *static_cast<const Variant *>(v);\n"
           "  const auto head = variant.score_head(b, h);\n"
           "  return variant.score_pair(head, variant.score_row(head, q), variant.score_column(head, kv),\n"
           "                            variant.score_distance(head, (int)(q - kv)), s);\n}\n"
           "inline float scoreModGrad(const void *v, float s, long long b, long long h, long long q, long long kv) {\n"
           "  const Variant &variant = *static_cast<const Variant *>(v);\n"
           "  const auto head = variant.score_head(b, h);\n"
           "  return variant.score_grad_pair(head, variant.score_row(head, q), variant.score_column(head, kv),\n"
           "                                 variant.score_distance(head, (int)(q - kv)), s);\n}\n"
        << "} // namespace " << ns << "\n\n";
    table << "    {" << seed << ", sizeof(" << ns << "::Variant), " << ns << "::scoreMod, " << ns
          << "::scoreModGrad},\n";
  }
  table << "};\n";
  std::ofstream file(argv[1]);
  file << out.str() << table.str();
  return file ? 0 : 1;
}
