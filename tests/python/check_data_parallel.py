"""Data parallel on c10d: 2 lopper processes reach the weights 1 process reaches with the doubled batch.

Both runs train examples/lenet300_100.onnx (no BatchNorm, so per-rank batch statistics play no
part) on the same .npy data with the same seed: one process with batch 2B, and two processes
(RANK 0 and 1, WORLD_SIZE 2, MASTER_ADDR 127.0.0.1, a free MASTER_PORT — what torchrun sets) with
batch B each. Each rank reads every other sample of the epoch's order, so step i of the pair sees
exactly the samples of step i of the single process, and the averaged gradients are the same.
Weights must agree within 1e-5, also when distilling from a teacher (each rank runs its own). Then
a rank whose peer never comes must fail with one clear line
within its timeout instead of hanging. Prints "N passed, N failed".
Usage: check_data_parallel.py LOPPER SOURCE_DIR
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper

from cases import run as run_cases


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def train_cmd(lopper, model, data, out, batch, extra=()):
    return [lopper, "train", model, "--data", data, "-o", out, "--epochs", "2", "--batch-size", str(batch),
            "--lr", "0.05", "--momentum", "0.9", "--seed", "3", "--threads", "1", *extra]


def env_for(rank, world, port):
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), LOCAL_RANK=str(rank))


def same_weights(lopper, src, tmp, extra=(), tag=""):
    rng = np.random.default_rng(0)
    np.save(os.path.join(tmp, "x.npy"), rng.random((96, 1, 28, 28), dtype=np.float32))
    np.save(os.path.join(tmp, "y.npy"), rng.integers(0, 10, 96))
    data = f"npy:{tmp}/x.npy,{tmp}/y.npy"
    one = os.path.join(tmp, f"one{tag}.onnx")
    r = subprocess.run(train_cmd(lopper, src, data, one, 16, extra), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr.strip()
    two = os.path.join(tmp, f"two{tag}.onnx")
    port = free_port()
    procs = [subprocess.Popen(train_cmd(lopper, src, data, two, 8, extra), env=env_for(rank, 2, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank}: {err.strip()}"
    a, b = weights(one), weights(two)
    start = weights(src)
    for k in a:
        err = float(np.abs(a[k] - b[k]).max())
        assert err <= 1e-5, f"{k}: 1 process vs 2 differ by {err:.3g}"
        assert not np.array_equal(a[k], start[k]), f"{k}: did not train"
    assert "on rank 0 of 2" in outs[0][1], outs[0][1]


def distilled(lopper, src, tmp):
    """A pruned student distilled from the dense model, 1 process vs 2 ranks."""
    student = os.path.join(tmp, "student.onnx")
    r = subprocess.run([lopper, "prune", src, "-o", student, "--method", "l1", "--amount", "0.7"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr.strip()
    same_weights(lopper, student, tmp, ["--teacher", src, "--distill-alpha", "0.6", "--distill-temperature", "2"],
                 tag=".distilled")
    with open(os.path.join(tmp, "two.distilled.onnx.train.json")) as f:
        epochs = json.load(f)["epochs"]
    assert all(e["distill_kl"] > 0 for e in epochs), epochs


def dead_peer(lopper, src, tmp):
    data = f"npy:{tmp}/x.npy,{tmp}/y.npy"
    t0 = time.time()
    r = subprocess.run(train_cmd(lopper, src, data, os.path.join(tmp, "dead.onnx"), 8) + ["--dist-timeout", "5"],
                       env=env_for(0, 2, free_port()), capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    assert r.returncode == 1, f"exit {r.returncode}: {r.stderr.strip()}"
    lines = [l for l in r.stderr.splitlines() if l.startswith("lopper:")]
    assert len(lines) == 1 and "[dist]" in lines[0], r.stderr
    assert took < 60, f"took {took:.0f} s to give up"
    assert not os.path.exists(os.path.join(tmp, "dead.onnx"))


def main():
    lopper, source = sys.argv[1], sys.argv[2]
    src = os.path.join(source, "examples", "lenet300_100.onnx")
    with tempfile.TemporaryDirectory() as tmp:
        return run_cases([("2 ranks == 1 process with the doubled batch", lambda: same_weights(lopper, src, tmp)),
                          ("distilled: 2 ranks == 1 process", lambda: distilled(lopper, src, tmp)),
                          ("a peer that never comes: one line, no hang", lambda: dead_peer(lopper, src, tmp))])


if __name__ == "__main__":
    sys.exit(main())
