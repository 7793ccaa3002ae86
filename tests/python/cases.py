"""The case runner every check_*.py shares: run each (name, function), report every failure and
keep going, end with "N passed, N failed". LOPPER_CASES=TEXT runs only the cases whose name
holds TEXT (make test-quick picks one that way); none matching is a failure."""


import concurrent.futures
import os
import time


def _one(what, fn):
    t0 = time.perf_counter()
    try:
        fn()
        return True, f"ok   {what} ({time.perf_counter() - t0:.1f} s)"
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        msg = (getattr(e, "stderr", None) or str(e) or repr(e)).strip()
        return False, f"FAIL {what} ({time.perf_counter() - t0:.1f} s): {msg}"


def run(cases, jobs=1):
    """cases: iterable of (name, zero-argument function that raises on a mismatch); `jobs` of them
    at a time (threads: the work is in subprocesses and native code, so cases must not share
    files). Returns the process exit code: 1 when any case failed."""
    passed = failed = 0
    only = os.environ.get("LOPPER_CASES")
    if only:
        cases = [c for c in cases if only in c[0]]
        if not cases:
            print(f"FAIL no case named like LOPPER_CASES={only!r}")
            return 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for ok, line in pool.map(lambda c: _one(*c), list(cases)):
            passed += ok
            failed += not ok
            print(line, flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
