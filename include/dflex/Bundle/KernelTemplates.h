//===- KernelTemplates.h - The kernel templates, embedded ---------*- C++ -*-===//
//
// The kernel templates of kernels/ and dflex/Expr/Semantics.h, compiled into
// the binary so that compiling a module needs no source tree. They are the
// headers of every module's compile request; their contents are part of
// every kernel's cache key.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_BUNDLE_KERNELTEMPLATES_H
#define DFLEX_BUNDLE_KERNELTEMPLATES_H

#include <vector>

namespace dflex::bundle {

struct EmbeddedHeader {
  const char *name; // as generated code includes it, e.g. "attention/attention.cuh"
  const char *contents;
};

const std::vector<EmbeddedHeader> &kernelHeaders();

} // namespace dflex::bundle

#endif // DFLEX_BUNDLE_KERNELTEMPLATES_H
