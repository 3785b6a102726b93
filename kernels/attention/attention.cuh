// The dflex attention kernel templates (forward, backward) in one include.
#pragma once

#include "backward.cuh"
#include "forward.cuh"
