"""What the benchmarks share when they write their results."""
import json
import os


def save_json(path, obj, indent=2):
    """Writes `obj` as JSON to `path` through a temporary file, so a run cut short leaves the last
    complete results in place."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=indent)
    os.replace(path + ".tmp", path)
