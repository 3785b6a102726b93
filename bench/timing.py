"""CUDA-event timing shared by the benchmarks.

Two views of one call: `median_ms` starts each call on an idle GPU (the
host's work before the first kernel is exposed, as after a
synchronisation), `steady_ms` runs calls back to back (the host prepares
the next call while the GPU runs the last one, as in a training loop that
does not synchronise every step).
"""

import torch


def median_ms(fn, iters=10, warm=3):
    """Median milliseconds of fn() over `iters` runs after `warm` warm-up runs,
    each started on an idle GPU."""
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


def steady_ms(fn, iters=20, warm=3):
    """Mean milliseconds per call of `iters` calls of fn() back to back."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def kernel_ms(fn, iters=10, warm=3):
    """GPU milliseconds per call of fn() of each kernel (and copy or memset)
    it launches, by name, over `iters` calls under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] = times.get(event.name, 0.0) + event.device_time / 1000 / iters
    return times
