//===- GatedDeltaModule.h - Gated-delta kernels of a dflex.gated_delta spec -*- C++ -*-===//

#ifndef DFLEX_CODEGEN_GATEDDELTAMODULE_H
#define DFLEX_CODEGEN_GATEDDELTAMODULE_H

#include "dflex/Codegen/AttentionModule.h"

namespace dflex::codegen {

/// Instantiates the chunked gated-delta kernels (kernels/gated_delta) for
/// `spec`: the kernels its options need, in launch order
/// (docs/gated-delta.md), with their shared memory as launch constants.
Result<GeneratedModule> generateGatedDelta(const bundle::GatedDeltaSpec &spec,
                                           const std::string &sourceName);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_GATEDDELTAMODULE_H
