"""The case runner every check_*.py shares: run each (name, function), report every failure and
keep going, end with "N passed, N failed"."""


def run(cases):
    """cases: iterable of (name, zero-argument function that raises on a mismatch). Returns the
    process exit code: 1 when any case failed."""
    passed = failed = 0
    for what, fn in cases:
        try:
            fn()
            passed += 1
            print(f"ok   {what}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            msg = (getattr(e, "stderr", None) or str(e) or repr(e)).strip()
            print(f"FAIL {what}: {msg}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
