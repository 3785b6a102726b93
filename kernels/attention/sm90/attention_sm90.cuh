// The dflex attention kernels for Hopper (sm_90a) in one include: the forward
// and backward with wgmma, warp-specialised (see config.cuh). Same parameters,
// tile lists and variant contract as the portable kernels (../attention.cuh).
#pragma once

#include "backward_wgmma.cuh"
#include "forward_wgmma.cuh"
