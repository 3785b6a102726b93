// Shared by the GPU harnesses: every CUDA runtime call's status is checked,
// and a failure names the call and where it was made.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CUDA_CHECK(expr)                                                                                  \
  do {                                                                                                    \
    const cudaError_t status_ = (expr);                                                                   \
    if (status_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(status_)); \
      std::exit(2);                                                                                       \
    }                                                                                                     \
  } while (0)
