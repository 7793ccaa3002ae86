"""Timing shared by the benchmarks that time Python callables (a peer's session, a torch module)."""
import statistics
import time


def times_ms(fn, warmup, iters):
    """The wall times of `fn()` in milliseconds, sorted, over `iters` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)


def median_ms(fn, warmup, iters):
    """The median wall time of `fn()` in milliseconds over `iters` runs after `warmup` runs."""
    return statistics.median(times_ms(fn, warmup, iters))


def median_spread(times):
    """(median, p90 / median) of a list of times: the spread `lopper bench` reports too."""
    t = sorted(times)
    med = statistics.median(t)
    p90 = t[min(len(t) - 1, int(round(0.9 * (len(t) - 1))))]
    return med, p90 / med


def round_ratio(num, den):
    """The median over rounds of num[i] / den[i]: two runtimes' times taken in the same rounds, so
    that each ratio compares runs made side by side (a slow spell of a shared machine cancels
    within its round). None when either list is empty or they differ in length."""
    if not num or not den or len(num) != len(den):
        return None
    return statistics.median(a / b for a, b in zip(num, den))
