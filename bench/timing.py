"""CUDA-event timing shared by the benchmarks."""

import torch


def median_ms(fn, iters=10, warm=3):
    """Median milliseconds of fn() over `iters` runs after `warm` warm-up runs."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]
