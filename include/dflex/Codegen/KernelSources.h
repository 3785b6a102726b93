//===- KernelSources.h - the kernel templates, embedded ----------*- C++ -*-===//
//
// The kernel templates of kernels/ and dflex/Expr/Semantics.h, compiled into
// the binary so that generating and compiling kernels needs no source tree.
// Their contents are part of every kernel's cache key.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_CODEGEN_KERNELSOURCES_H
#define DFLEX_CODEGEN_KERNELSOURCES_H

#include <string>
#include <vector>

namespace dflex::codegen {

struct EmbeddedHeader {
  const char *name; // as generated code includes it, e.g. "attention/attention.cuh"
  const char *contents;
};

const std::vector<EmbeddedHeader> &kernelHeaders();

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_KERNELSOURCES_H
