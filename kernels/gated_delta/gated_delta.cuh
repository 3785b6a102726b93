// The dflex chunked gated-delta-rule kernel templates (forward, backward) in
// one include. docs/gated-delta.md describes the algorithm and the launch
// sequence; config.cuh the compile-time variants; params.cuh the parameters
// and the workspace.
#pragma once

#include "backward.cuh"
#include "forward.cuh"
