"""Bad inputs against the lopper binary: each must fail cleanly, with nothing lost or left behind.

For every case, in its own fresh temporary folder (the command's working folder), with copies of
small models and whatever the case makes (FIFOs, symbolic links, crafted models, .npy data):

  - the exit code: 2 for usage errors (bad flags, impossible amounts, outputs lopper refuses),
    1 for bad files, models and data (the EXPECT table below, one place to adjust);
  - stderr: exactly one non-empty line, containing one of the case's words (case-insensitive);
    a case that succeeds (exit 0) with words only needs one stderr line containing one;
  - nothing left behind: the folder is listed (recursively, hidden files included) before and
    after; a new entry (an output, its .data/.report.json/.train.json, a temporary) is a failure
    unless the case allows it;
  - every input unchanged: sha256 of every regular file, the type of every entry (a FIFO stays a
    FIFO, a folder keeps its files), the target of every symbolic link and the type of what it
    points to (a link to /dev/null must still reach a character device);
  - no hang: a command still running after --timeout seconds (60) is killed (its own process
    group) and the case fails, named.

Usage: robustness.py LOPPER FIXTURES_DIR [--only NAME[,NAME...]] [--list] [--keep] [--timeout S]
       [--jobs N]
Exit status: 0 when every case passed or was skipped, 1 otherwise.
"""

import argparse
import concurrent.futures
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# --------------------------------------------------------------------------------------------
# Expectations: case name -> (exit codes, words). Exit codes: an int or a tuple of allowed ints.
# Words: stderr must be exactly one line containing one of them (case-insensitive); None: stderr
# is not checked (only for cases that succeed). Cases that fail on today's binary are the bugs the
# current fixes address; adjust a row here when a fix settles on another code or wording.
# --------------------------------------------------------------------------------------------
FIFO_WORDS = ["fifo", "not a regular file"]
CHR_WORDS = ["character device", "not a regular file", "device", "symbolic link"]
DIR_WORDS = ["folder", "directory"]

EXPECT = {
    # --- data loss and damage: train --checkpoint-dir
    "train-checkpoint-dir-user-folder": (2, ["checkpoint"]),
    "train-checkpoint-dir-regular-file": (2, ["checkpoint"]),
    "train-checkpoint-dir-is-input-model": (2, ["checkpoint", "input"]),
    "train-checkpoint-dir-dot": (2, ["checkpoint"]),
    "train-checkpoint-dir-own-replaced": (0, None),   # then --resume works (checked too)
    # --- distillation's teacher
    "train-teacher-truncated": (1, ["onnx", "protobuf", "truncated"]),
    "train-teacher-is-fifo": (1, FIFO_WORDS),
    "train-teacher-is-output": (2, ["input"]),
    "train-teacher-other-inputs": (2, ["teacher", "inputs"]),
    "usage-train-distill-alpha-2": (2, ["distill-alpha"]),
    "usage-train-distill-without-teacher": (2, ["--teacher"]),
    # --- outputs onto special files
    "prune-o-fifo": (2, FIFO_WORDS),
    "prune-o-chardev": (2, CHR_WORDS),
    "prune-o-dir": (2, DIR_WORDS),
    "convert-o-fifo": (2, FIFO_WORDS),
    "convert-o-chardev": (2, CHR_WORDS),
    "convert-o-dir": (2, DIR_WORDS),
    "train-o-fifo": (2, FIFO_WORDS),
    "train-o-chardev": (2, CHR_WORDS),
    "train-o-dir": (2, DIR_WORDS),
    "prune-report-fifo": (2, FIFO_WORDS),
    "prune-report-chardev": (2, CHR_WORDS),
    "prune-report-dir": (2, DIR_WORDS),
    "sensitivity-o-fifo": (2, FIFO_WORDS),
    "sensitivity-o-chardev": (2, CHR_WORDS),
    "sensitivity-o-dir": (2, DIR_WORDS),
    "compare-report-fifo": (2, FIFO_WORDS),
    "compare-report-chardev": (2, CHR_WORDS),
    "compare-report-dir": (2, DIR_WORDS),
    "run-out-regular-file": (2, ["folder", "directory", "not a"]),
    "run-out-fifo": (2, ["folder", "directory", "fifo"]),
    # --- outputs onto what an input reads; failures leave nothing
    "convert-external-data-over-input-data": (2, ["input", "a.onnx.data"]),
    "prune-failing-leaves-nothing": ((1, 2), ["missing.npy", "missing2.npy", "no such file"]),
    "prune-report-read-only-folder": ((1, 2), ["permission", "cannot write", "read-only",
                                               "report"]),
    # --- hangs and untrusted input
    "external-data-fifo-inspect": (1, ["pipe.bin"]),
    "external-data-fifo-convert": (1, ["pipe.bin"]),
    "model-is-fifo-inspect": (1, FIFO_WORDS),
    "model-is-fifo-prune": (1, FIFO_WORDS),
    "recipe-is-fifo": (1, FIFO_WORDS),
    "data-npy-is-fifo": (1, FIFO_WORDS),
    "constant-of-shape-huge-run": (1, ["huge_fill"]),
    "constant-of-shape-huge-bench": (1, ["huge_fill"]),
    "constant-of-shape-huge-inspect": (1, ["huge_fill"]),
    "bench-batch-huge": (2, ["batch"]),
    "inspect-shape-huge": ((1, 2), ["image", "shape", "too large", "memory"]),
    "bench-threads-huge": (2, ["threads"]),
    "bench-threads-negative": (2, ["threads"]),
    "inspect-threads-huge": (2, ["threads"]),
    "bench-iters-zero": (2, ["--iters"]),
    "bench-warmup-negative": (2, ["--warmup"]),
    "compare-batch-zero": (2, ["--batch"]),
    "convert-sparse-and-dense": (2, ["--sparse-initializers does not go with --dense"]),
    "run-input-not-npy": (2, ["must be .npy or .pb"]),
    "graph-cycle-inspect": (1, ["cycle"]),
    "graph-cycle-prune": (1, ["cycle"]),
    "duplicate-initializer": (1, ["dup_weight", "duplicate"]),
    "opset-99": (1, ["opset"]),
    "opset-0": (1, ["opset"]),
    # --- consistency: usage errors exit 2
    "usage-prune-amount-above-1": (2, ["amount"]),
    "usage-prune-amount-negative": (2, ["amount"]),
    "usage-prune-pattern-5:4": (2, ["5:4", "n:m", "pattern"]),
    "usage-prune-method-foo": (2, ["foo", "method"]),
    "usage-prune-scope-galaxy": (2, ["galaxy", "scope"]),
    "usage-train-epochs-0": (2, ["epochs"]),
    "usage-train-device-tpu": (2, ["tpu", "device"]),
    "usage-bench-device-tpu": (2, ["tpu", "device"]),
    "usage-prune-structured-without-unit": (2, ["unit"]),
    "usage-prune-structured-recipe-and-amount": (2, ["--recipe", "drop --amount"]),
    "usage-prune-structured-activation-without-data": (2, ["activation", "--data"]),
    "usage-prune-structured-expert-onnx": (2, ["unit=\"expert\""]),
    "usage-prune-structured-block-without-data": (2, ["influence", "--data"]),
    "usage-prune-structured-block-with-scope": (2, ["--scope", "block"]),
    "prune-structured-block-none-in-model": (1, ["no residual block"]),
    # --- consistency: what succeeds says and writes the right thing
    "prune-amount-1-warns": (0, ["every weight", "all weights", "all its weights",
                                 "all of its weights"]),
    "compare-report-is-html": (0, None),
    "inspect-json-external-data-file-bytes": (0, None),
    # --- already handled (must keep passing)
    "missing-model": (1, ["nope.onnx"]),
    "folder-as-model": (1, DIR_WORDS),
    "empty-model-file": (1, ["onnx", "empty"]),
    "random-bytes-model": (1, ["onnx", "protobuf"]),
    "truncated-model": (1, ["onnx", "protobuf", "truncated"]),
    "external-data-escapes-dotdot": (1, ["../x", "outside", "escape"]),
    "external-data-escapes-absolute": (1, ["/etc/passwd", "absolute"]),
    "external-data-past-end": (1, ["w.bin"]),
    "npy-bad-header": (1, ["header"]),
    "input-wrong-shape": (1, ["shape"]),
    "o-names-input-model": (2, ["input"]),
    "report-names-input-model": (2, ["input"]),
    "unknown-command": (2, ["unknown command"]),
    "unknown-flag": (2, ["--frob"]),
    "recipe-malformed-yaml": (1, ["yaml"]),
    "recipe-unknown-method": (1, ["method"]),
    "data-unknown-kind": (1, ["foo:bar"]),
    # --- hostile names and patterns: linear-time matching
    "exclude-on-a-200k-character-name": (0, None),
    "exclude-backtracking-pattern": (0, None),
    "exclude-lookahead-refused": (2, ["regex"]),
    # --- external data that lies
    "external-data-overlapping-ranges": (1, ["overlaps"]),
    "external-data-negative-offset": (1, ["negative"]),
    # --- outputs the file system cannot take
    "prune-o-name-too-long": (2, ["too long"]),
    "prune-file-size-limit": (1, ["too large"]),
    "prune-disk-full": (1, ["no space left"]),
    # --- what succeeds but measures another model than the one deployed: one warning
    "run-batchnorm-in-training-mode": (0, ["training mode"]),
    # --- a poisoned kernel cache: ignored with one warning, never a hang or a raw message
    "kernel-cache-fifo-bench": (0, ["kernel cache"]),
    "kernel-cache-folder-bench": (0, ["kernel cache"]),
    "kernel-cache-fifo-inspect": (0, None),
    "kernel-cache-wrong-shapes-bench": (0, None),
    # --- one checkpoint folder, one run
    "train-checkpoint-dir-held-by-another-run": (2, ["in use"]),
}

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOPPER = None      # set in main()
FIXTURES = None
TIMEOUT = 60.0
DEV_NULL = "/dev/null"


class SetupError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Inputs the cases make
# --------------------------------------------------------------------------------------------

def copy_model(d, which="lenet5", name="m.onnx"):
    src = {"lenet5": os.path.join(ROOT, "examples", "lenet5.onnx"),
           "cnn_small": os.path.join(ROOT, "examples", "cnn_small.onnx"),
           "mlp": os.path.join(FIXTURES, "mlp.ts.onnx")}[which]
    shutil.copyfile(src, os.path.join(d, name))


def write_data(d, n=64, x="x.npy", y="y.npy"):
    """n Fashion-MNIST-shaped samples (the examples' 1x28x28 input) and their labels."""
    rng = np.random.default_rng(0)
    np.save(os.path.join(d, x), rng.random((n, 1, 28, 28), dtype=np.float32))
    np.save(os.path.join(d, y), rng.integers(0, 10, n).astype(np.int64))


def write_input(d, name="in.npy", shape=(1, 1, 28, 28)):
    np.save(os.path.join(d, name), np.zeros(shape, dtype=np.float32))


def save_raw(model, path):
    """Serialises the proto as is (onnx.save_model would try to resolve external data)."""
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def external_tensor(name, dims, location, offset=0, length=None):
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    n = int(np.prod(dims)) * 4
    for k, v in (("location", location), ("offset", str(offset)),
                 ("length", str(n if length is None else length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def gemm_model(weight=None, extra_inits=(), opset=17, extra_nodes=(), outputs=None):
    """X[1,8] -> Gemm(W[16,8], transB) -> Y[1,16]: the smallest model with a prunable layer."""
    if weight is None:
        weight = helper.make_tensor("W", TensorProto.FLOAT, [16, 8],
                                    np.linspace(-1, 1, 128, dtype=np.float32).tolist())
    nodes = [helper.make_node("Gemm", ["X", weight.name], ["Y"], name="fc", transB=1),
             *extra_nodes]
    outs = outputs or [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 16])]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8])
    g = helper.make_graph(nodes, "g", [x], outs, initializer=[weight, *extra_inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                             producer_name="robustness")


def constant_of_shape_model():
    """ConstantOfShape of [1000000, 1000000] floats (4 TB) added to a [1] input."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1000000, 1000000])
    nodes = [helper.make_node("Constant", [], ["S"], name="shape_const", value=shape),
             helper.make_node("ConstantOfShape", ["S"], ["C"], name="huge_fill",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])),
             helper.make_node("Add", ["C", "X"], ["Y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                         [1000000, 1000000])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def cycle_model():
    """fc -> loop_a(H, B) -> A; loop_b(A, H) -> B: A and B feed each other."""
    nodes = [helper.make_node("Add", ["Y", "B"], ["A"], name="loop_a"),
             helper.make_node("Add", ["A", "Y"], ["B"], name="loop_b")]
    return gemm_model(extra_nodes=nodes,
                      outputs=[helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 16])])


def duplicate_initializer_model():
    w1 = helper.make_tensor("dup_weight", TensorProto.FLOAT, [16, 8], [0.5] * 128)
    w2 = helper.make_tensor("dup_weight", TensorProto.FLOAT, [16, 8], [-0.25] * 128)
    return gemm_model(weight=w1, extra_inits=[w2])


def external_data_model(path, location, length=None):
    """A Gemm model at `path` whose weight lives in `location` (relative to the model's folder)."""
    save_raw(gemm_model(weight=external_tensor("W", [16, 8], location, length=length)), path)


def mkfifo(d, name):
    os.mkfifo(os.path.join(d, name))


def symlink_dev_null(d, name):
    os.symlink(DEV_NULL, os.path.join(d, name))


def user_folder(d, name):
    os.mkdir(os.path.join(d, name))
    with open(os.path.join(d, name, "notes.txt"), "w") as f:
        f.write("a user's file lopper must not touch\n")


def run_lopper(d, args, timeout=None, env=None, fsize=None):
    """(returncode or None on a hang, stdout, stderr) of lopper ARGS run in folder d, with `env`
    added to the environment and `fsize` as its file-size limit."""
    import resource

    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    p = subprocess.Popen([LOPPER, *args], cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True, env={**os.environ, **(env or {})},
                         preexec_fn=limit if fsize is not None else None)
    try:
        out, err = p.communicate(timeout=timeout or TIMEOUT)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)   # the process group lopper leads, nothing else
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        return None, out, err


def lopper_ok(d, args):
    """A set-up step run with lopper itself; the case cannot be judged if it fails."""
    rc, out, err = run_lopper(d, args)
    if rc != 0:
        raise SetupError(f"set-up `lopper {' '.join(args)}` gave {rc}: {err.strip()[-300:]}")
    return out


# --------------------------------------------------------------------------------------------
# Snapshots of a case's folder
# --------------------------------------------------------------------------------------------

def kind_of(mode):
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISLNK, "symbolic link"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "other"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def describe(path):
    """What an entry is, without opening anything that could block (FIFOs, devices)."""
    st = os.lstat(path)
    k = kind_of(st.st_mode)
    if k == "file":
        return (k, sha256(path), stat.S_IMODE(st.st_mode))
    if k == "folder":
        return (k, stat.S_IMODE(st.st_mode))
    if k == "symbolic link":
        target = os.readlink(path)
        try:
            tst = os.stat(path)
            what = (kind_of(tst.st_mode), tst.st_rdev if stat.S_ISCHR(tst.st_mode) else 0)
        except OSError:
            what = ("missing", 0)
        return (k, target, what)
    if k in ("character device", "block device"):
        return (k, st.st_rdev)
    return (k,)


def snapshot(d):
    snap = {}
    for top, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(top, n)
            snap[os.path.relpath(p, d)] = describe(p)
    return snap


def show(desc):
    if desc[0] == "file":
        return f"file sha256 {desc[1][:12]}"
    if desc[0] == "symbolic link":
        return f"symbolic link to {desc[1]} ({desc[2][0]})"
    return desc[0]


def allowed(path, patterns):
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def diff_snapshots(before, after, allow):
    problems = []
    gone = {p for p in before if p not in after and not allowed(p, allow)}
    for p in sorted(before):
        if allowed(p, allow) or os.path.dirname(p) in gone:
            continue
        if p not in after:
            problems.append(f"{p} ({show(before[p])}) removed")
        elif after[p] != before[p]:
            problems.append(f"{p} changed: {show(before[p])} -> {show(after[p])}")
    new = sorted(p for p in set(after) - set(before) if not allowed(p, allow))
    for p in new:
        if os.path.dirname(p) in new:
            continue   # folded into its new folder's line
        inside = sum(1 for q in new if q.startswith(p + os.sep))
        problems.append(f"left behind: {p} ({show(after[p])}"
                        + (f" with {inside} entries)" if inside else ")"))
    return problems


def dev_null_ok():
    try:
        st = os.lstat(DEV_NULL)
        return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    except OSError:
        return False


def repair_dev_null():
    """Puts /dev/null back if a case damaged it (only possible as root); says so loudly."""
    if dev_null_ok() or os.geteuid() != 0:
        return
    try:
        if os.path.lexists(DEV_NULL) and not os.path.isdir(DEV_NULL):
            os.unlink(DEV_NULL)
        os.mknod(DEV_NULL, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(DEV_NULL, 0o666)
        print("!!! /dev/null was damaged by a case and has been recreated", flush=True)
    except OSError as e:
        print(f"!!! /dev/null was damaged by a case and could not be recreated: {e}", flush=True)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

class Case:
    """args: lopper's arguments (run in the case's folder); setup(d): makes the inputs;
    allow: glob patterns (relative paths) the command may create or change; check(d, out, err):
    further problems (a list of strings); skip(): a reason to skip, or None; depends: a case that
    must PASS first (else this one is skipped); serial: run alone (memory, /dev/null);
    watch_dev: the command names /dev/null through a link: nothing new may appear in /dev;
    may_block: an unfixed lopper may wait on a FIFO until killed: these cases run all at once,
    beside the others, so that each hang costs the timeout once, not once per case."""

    def __init__(self, name, args, setup=None, allow=(), check=None, skip=None, depends=None,
                 serial=False, models=("lenet5",), data=False, timeout=None, watch_dev=False,
                 may_block=False, env=None, fsize=None):
        assert name in EXPECT, f"{name} has no row in EXPECT"
        self.name, self.args, self.setup, self.allow = name, args, setup, tuple(allow)
        self.check, self.skip, self.depends, self.serial = check, skip, depends, serial
        self.models, self.data, self.timeout = models, data, timeout
        self.watch_dev = watch_dev   # also look for temporaries lopper left in /dev
        self.may_block = may_block   # a FIFO an unfixed lopper may wait on: runs in its own pool
        self.env = env               # env(d): variables set for the command (paths in d)
        self.fsize = fsize           # RLIMIT_FSIZE (ulimit -f) of the command, in bytes


CASES = []


def case(*a, **k):
    CASES.append(Case(*a, **k))


PRUNE = ["prune", "m.onnx", "--method", "l1", "--amount", "0.5"]
TRAIN = ["train", "m.onnx", "--data", "npy:x.npy,y.npy", "--epochs", "1", "--no-eval"]
SENS = ["sensitivity", "m.onnx", "--data", "npy:x.npy,y.npy", "--amounts", "0.5",
        "--eval-batches", "1"]
COMPARE = ["compare", "m.onnx", "m2.onnx", "--iters", "3"]


def as_root_skip():
    return "running as root: permissions do not stop writes" if os.geteuid() == 0 else None


# --- data loss: train --checkpoint-dir
case("train-checkpoint-dir-user-folder", TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "ck"],
     setup=lambda d: user_folder(d, "ck"), data=True)
case("train-checkpoint-dir-regular-file", TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "ck"],
     setup=lambda d: open(os.path.join(d, "ck"), "w").write("not a folder\n"), data=True)
case("train-checkpoint-dir-is-input-model",
     TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "m.onnx"], data=True)
case("train-checkpoint-dir-dot", TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "."], data=True)


FIRST_CHECKPOINT = {}   # case folder -> (inode, mtime) of the first run's newest state.json


def ckpt_state(d):
    """The newest checkpoint's state.json: ck/latest names its epoch-N folder."""
    try:
        name = open(os.path.join(d, "ck", "latest")).read().strip()
    except OSError:
        return None
    return os.path.join(d, "ck", name, "state.json")


def ckpt_first_run(d):
    lopper_ok(d, TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "ck"])
    state = ckpt_state(d)
    if not state or not os.path.isfile(state):
        raise SetupError("the first run made no checkpoint (ck/latest -> epoch-N/state.json)")
    st = os.stat(state)
    FIRST_CHECKPOINT[d] = (st.st_ino, st.st_mtime_ns)


def ckpt_resume(d, out, err):
    problems = []
    state = ckpt_state(d)
    if not state:
        problems.append("the replaced checkpoint folder has no 'latest'")
    else:
        for f in ("model.onnx", "state.json"):
            if not os.path.isfile(os.path.join(os.path.dirname(state), f)):
                problems.append(f"the replaced checkpoint has no {f}")
        if os.path.isfile(state):
            st = os.stat(state)
            if (st.st_ino, st.st_mtime_ns) == FIRST_CHECKPOINT.get(d):
                problems.append("the newest state.json is the first run's: not replaced")
    for leftover in ("ck.tmp", "ck.old"):
        if os.path.lexists(os.path.join(d, leftover)):
            problems.append(f"left behind: {leftover}")
    hidden = [f for f in os.listdir(os.path.join(d, "ck")) if ".tmp" in f]
    if hidden:
        problems.append(f"temporaries left in ck: {hidden}")
    rc, _, rerr = run_lopper(d, ["train", "m.onnx", "--data", "npy:x.npy,y.npy", "--epochs", "2",
                                 "--no-eval", "-o", "resumed.onnx", "--resume", "ck"])
    if rc != 0:
        problems.append(f"--resume ck afterwards gave {rc}: {rerr.strip()[-200:]}")
    return problems


case("train-checkpoint-dir-own-replaced", TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "ck"],
     setup=ckpt_first_run, data=True,
     allow=["ck", "ck/*", "out.onnx", "out.onnx.train.json"], check=ckpt_resume)

# --- outputs onto a FIFO, a character device (through a link to /dev/null), a folder
OUTPUT_FLAGS = {
    "prune-o": (PRUNE + ["-o", "{}"], ".onnx", False),
    "convert-o": (["convert", "m.onnx", "-o", "{}"], ".onnx", False),
    "train-o": (TRAIN + ["-o", "{}"], ".onnx", True),
    "prune-report": (PRUNE + ["-o", "out.onnx", "--report", "{}"], ".html", False),
    "sensitivity-o": (SENS + ["-o", "{}"], ".json", True),
    "compare-report": (COMPARE + ["--report", "{}"], ".html", False),
}


def special_setup(kind, name, compare):
    def setup(d):
        if compare:
            copy_model(d, "lenet5", "m2.onnx")
        if kind == "fifo":
            mkfifo(d, name)
        elif kind == "chardev":
            symlink_dev_null(d, name)
        else:
            user_folder(d, name)
    return setup


for stem, (argv, ext, needs_data) in OUTPUT_FLAGS.items():
    for kind, fname in (("fifo", "pipe" + ext), ("chardev", "null" + ext), ("dir", "dir" + ext)):
        case(f"{stem}-{kind}", [a.format(fname) for a in argv],
             setup=special_setup(kind, fname, stem.startswith("compare")), data=needs_data,
             # /dev/null only once the same command refuses a FIFO: an unfixed binary might
             # replace what the link points to.
             depends=f"{stem}-fifo" if kind == "chardev" else None, may_block=kind == "fifo",
             serial=kind == "chardev", watch_dev=kind == "chardev")

case("run-out-regular-file", ["run", "m.onnx", "--input", "image=in.npy", "--out", "res"],
     setup=lambda d: (write_input(d), open(os.path.join(d, "res"), "w").write("results\n")))
case("run-out-fifo", ["run", "m.onnx", "--input", "image=in.npy", "--out", "res"],
     setup=lambda d: (write_input(d), mkfifo(d, "res")), may_block=True)


# --- an output onto the data file an input reads
def two_external_models(d):
    m = onnx.load(os.path.join(d, "m.onnx"))
    onnx.save_model(m, os.path.join(d, "a.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="a.onnx.data", size_threshold=0)
    shutil.copyfile(os.path.join(d, "a.onnx"), os.path.join(d, "b.onnx"))


case("convert-external-data-over-input-data",
     ["convert", "b.onnx", "-o", "a.onnx", "--external-data"], setup=two_external_models)

# --- a failing command leaves nothing
case("prune-failing-leaves-nothing",
     PRUNE + ["-o", "out.onnx", "--report", "r.html", "--data", "npy:missing.npy,missing2.npy"])


def read_only_folder(d):
    os.mkdir(os.path.join(d, "ro"))
    os.chmod(os.path.join(d, "ro"), 0o555)


case("prune-report-read-only-folder", PRUNE + ["-o", "out.onnx", "--report", "ro/r.html"],
     setup=read_only_folder, skip=as_root_skip)


# --- hangs and untrusted input
def external_fifo(d):
    external_data_model(os.path.join(d, "w.onnx"), "pipe.bin")
    mkfifo(d, "pipe.bin")


case("external-data-fifo-inspect", ["inspect", "w.onnx"], setup=external_fifo, may_block=True)
case("external-data-fifo-convert", ["convert", "w.onnx", "-o", "out.onnx"], setup=external_fifo,
     may_block=True)
case("model-is-fifo-inspect", ["inspect", "pipe.onnx"], setup=lambda d: mkfifo(d, "pipe.onnx"),
     may_block=True)
case("model-is-fifo-prune", ["prune", "pipe.onnx", "-o", "out.onnx", "--method", "l1",
                             "--amount", "0.5"], setup=lambda d: mkfifo(d, "pipe.onnx"),
     may_block=True)
case("recipe-is-fifo", ["prune", "m.onnx", "-o", "out.onnx", "--recipe", "pipe.yaml"],
     setup=lambda d: mkfifo(d, "pipe.yaml"), may_block=True)


def npy_fifo(d):
    write_data(d)
    mkfifo(d, "pipe.npy")


case("data-npy-is-fifo", ["train", "m.onnx", "--data", "npy:pipe.npy,y.npy", "--epochs", "1",
                          "--no-eval", "-o", "out.onnx"], setup=npy_fifo, may_block=True)


def teacher_truncated(d):
    write_data(d)
    truncated(d)


def teacher_fifo(d):
    write_data(d)
    mkfifo(d, "pipe.onnx")


case("train-teacher-truncated", TRAIN + ["-o", "out.onnx", "--teacher", "t.onnx"], setup=teacher_truncated)
case("train-teacher-is-fifo", TRAIN + ["-o", "out.onnx", "--teacher", "pipe.onnx"], setup=teacher_fifo,
     may_block=True)
case("train-teacher-is-output", TRAIN + ["-o", "m2.onnx", "--teacher", "m2.onnx"], data=True,
     setup=lambda d: copy_model(d, "lenet5", "m2.onnx"))
case("train-teacher-other-inputs", TRAIN + ["-o", "out.onnx", "--teacher", "m2.onnx"], data=True,
     setup=lambda d: copy_model(d, "mlp", "m2.onnx"))
case("usage-train-distill-alpha-2", TRAIN + ["-o", "out.onnx", "--teacher", "m.onnx", "--distill-alpha", "2"],
     data=True)
case("usage-train-distill-without-teacher", TRAIN + ["-o", "out.onnx", "--distill-temperature", "2"],
     data=True)


def cos_setup(d):
    save_raw(constant_of_shape_model(), os.path.join(d, "huge.onnx"))
    write_input(d, "x1.npy", (1,))


case("constant-of-shape-huge-run", ["run", "huge.onnx", "--input", "X=x1.npy", "--out", "res"],
     setup=cos_setup, models=(), serial=True)
case("constant-of-shape-huge-bench", ["bench", "huge.onnx", "--iters", "1", "--warmup", "0"],
     setup=cos_setup, models=(), serial=True)
case("constant-of-shape-huge-inspect", ["inspect", "huge.onnx"], setup=cos_setup, models=(),
     serial=True)
case("bench-batch-huge", ["bench", "m.onnx", "--batch", "1000000000"], serial=True)
case("inspect-shape-huge", ["inspect", "m.onnx", "--shape", "image=100000x100000x100000"],
     serial=True)
case("bench-threads-huge", ["bench", "m.onnx", "--threads", "100000", "--iters", "1"])
case("bench-threads-negative", ["bench", "m.onnx", "--threads", "-1", "--iters", "1"])
case("bench-iters-zero", ["bench", "m.onnx", "--iters", "0"])
case("bench-warmup-negative", ["bench", "m.onnx", "--warmup", "-1", "--iters", "1"])
case("compare-batch-zero", COMPARE[:2] + ["m.onnx", "--batch", "0", "--iters", "1"])
case("convert-sparse-and-dense", ["convert", "m.onnx", "-o", "out.onnx", "--sparse-initializers",
                                  "--dense"])
case("run-input-not-npy", ["run", "m.onnx", "--input", "image=x.txt", "--out", "res"],
     setup=lambda d: open(os.path.join(d, "x.txt"), "w").write("1"))
# alone: an unfixed lopper starts 100000 threads, and the cases beside it could start none
case("inspect-threads-huge", ["inspect", "m.onnx", "--threads", "100000"], serial=True)


def model_setup(make, name="g.onnx"):
    return lambda d: save_raw(make(), os.path.join(d, name))


case("graph-cycle-inspect", ["inspect", "g.onnx"], setup=model_setup(cycle_model), models=())
case("graph-cycle-prune", ["prune", "g.onnx", "-o", "out.onnx", "--method", "l1", "--amount",
                           "0.5"], setup=model_setup(cycle_model), models=())
case("duplicate-initializer", ["inspect", "g.onnx"], setup=model_setup(duplicate_initializer_model),
     models=())
case("opset-99", ["inspect", "g.onnx"], setup=model_setup(lambda: gemm_model(opset=99)), models=())
case("opset-0", ["inspect", "g.onnx"], setup=model_setup(lambda: gemm_model(opset=0)), models=())

# --- usage errors
case("usage-prune-amount-above-1", ["prune", "m.onnx", "-o", "out.onnx", "--method", "l1",
                                    "--amount", "1.5"])
case("usage-prune-amount-negative", ["prune", "m.onnx", "-o", "out.onnx", "--method", "l1",
                                     "--amount", "-0.1"])
case("usage-prune-pattern-5:4", PRUNE + ["-o", "out.onnx", "--pattern", "5:4"])
case("usage-prune-method-foo", ["prune", "m.onnx", "-o", "out.onnx", "--method", "foo",
                                "--amount", "0.5"])
case("usage-prune-scope-galaxy", PRUNE + ["-o", "out.onnx", "--scope", "galaxy"])
case("usage-train-epochs-0", ["train", "m.onnx", "--data", "npy:x.npy,y.npy", "--epochs", "0",
                              "-o", "out.onnx"], data=True)
case("usage-train-device-tpu", TRAIN + ["-o", "out.onnx", "--device", "tpu"], data=True)
case("usage-bench-device-tpu", ["bench", "m.onnx", "--device", "tpu", "--iters", "1"])


# --- what succeeds says and writes the right thing
def out_written(d, out, err):
    return [] if os.path.isfile(os.path.join(d, "out.onnx")) else ["out.onnx not written"]


case("prune-amount-1-warns", ["prune", "m.onnx", "-o", "out.onnx", "--method", "l1",
                              "--amount", "1.0"],
     allow=["out.onnx", "out.onnx.report.json"], check=out_written)


def html_check(d, out, err):
    p = os.path.join(d, "x.html")
    if not os.path.isfile(p):
        return ["x.html not written"]
    with open(p, "rb") as f:
        head = f.read(200).lstrip().lower()
    if head.startswith(b"<!doctype html") or head.startswith(b"<html"):
        return []
    return [f"x.html is not HTML: starts {head[:40]!r}"]


case("compare-report-is-html", COMPARE + ["--report", "x.html"],
     setup=lambda d: copy_model(d, "lenet5", "m2.onnx"), allow=["x.html"], check=html_check)


def file_bytes_check(d, out, err):
    try:
        got = json.loads(out)["file_bytes"]
    except (ValueError, KeyError, TypeError) as e:
        return [f"inspect --json printed no file_bytes ({e})"]
    want = os.path.getsize(os.path.join(d, "a.onnx")) + os.path.getsize(os.path.join(d,
                                                                                 "a.onnx.data"))
    return [] if got == want else [f"file_bytes {got}, want {want} (a.onnx + a.onnx.data)"]


case("inspect-json-external-data-file-bytes", ["inspect", "--json", "a.onnx"],
     setup=two_external_models, check=file_bytes_check)

# --- already handled
case("missing-model", ["inspect", "nope.onnx"], models=())
case("folder-as-model", ["inspect", "m.onnx"], setup=lambda d: user_folder(d, "m.onnx"), models=())
case("empty-model-file", ["inspect", "e.onnx"], setup=lambda d: open(os.path.join(d, "e.onnx"),
                                                                     "wb").close(), models=())
case("random-bytes-model", ["inspect", "r.onnx"],
     setup=lambda d: open(os.path.join(d, "r.onnx"), "wb").write(
         np.random.default_rng(1).bytes(4096)), models=())


def truncated(d):
    with open(os.path.join(d, "m.onnx"), "rb") as f:
        head = f.read(1000)
    with open(os.path.join(d, "t.onnx"), "wb") as f:
        f.write(head)


case("truncated-model", ["inspect", "t.onnx"], setup=truncated)


def escape_dotdot(d):
    os.mkdir(os.path.join(d, "sub"))
    with open(os.path.join(d, "x"), "wb") as f:
        f.write(b"\0" * 512)
    external_data_model(os.path.join(d, "sub", "w.onnx"), "../x")


case("external-data-escapes-dotdot", ["inspect", "sub/w.onnx"], setup=escape_dotdot, models=())
case("external-data-escapes-absolute", ["inspect", "w.onnx"],
     setup=lambda d: external_data_model(os.path.join(d, "w.onnx"), "/etc/passwd"), models=())


def past_end(d):
    with open(os.path.join(d, "w.bin"), "wb") as f:
        f.write(b"\0" * 100)
    external_data_model(os.path.join(d, "w.onnx"), "w.bin")


case("external-data-past-end", ["inspect", "w.onnx"], setup=past_end, models=())


def named_gemm(d, name):
    """m.onnx: the Gemm model with its layer named `name`."""
    m = gemm_model()
    m.graph.node[0].name = name
    save_raw(m, os.path.join(d, "m.onnx"))


case("exclude-on-a-200k-character-name", PRUNE + ["--exclude", ".*embed.*", "-o", "out.onnx"],
     setup=lambda d: named_gemm(d, "x" * 200000), models=(), allow=("out.onnx*",), timeout=30)
case("exclude-backtracking-pattern", PRUNE + ["--exclude", "(a+)+z", "-o", "out.onnx"],
     setup=lambda d: named_gemm(d, "a" * 1000), models=(), allow=("out.onnx*",), timeout=30)
case("usage-prune-structured-without-unit",
     ["prune", "m.onnx", "--structured", "--amount", "0.5", "-o", "out.onnx"])
case("exclude-lookahead-refused", PRUNE + ["--exclude", "(?=fc)", "-o", "out.onnx"])


def overlapping(d):
    with open(os.path.join(d, "w.bin"), "wb") as f:
        f.write(np.linspace(-1, 1, 128, dtype=np.float32).tobytes())
    w2 = external_tensor("W2", [16, 8], "w.bin", offset=0)
    add = helper.make_node("Gemm", ["X", "W2"], ["Z"], name="fc2", transB=1)
    save_raw(gemm_model(weight=external_tensor("W", [16, 8], "w.bin"), extra_inits=[w2],
                        extra_nodes=[add]), os.path.join(d, "w.onnx"))


def negative_offset(d):
    with open(os.path.join(d, "w.bin"), "wb") as f:
        f.write(b"\0" * 1024)
    save_raw(gemm_model(weight=external_tensor("W", [16, 8], "w.bin", offset=-8)),
             os.path.join(d, "w.onnx"))


case("external-data-overlapping-ranges", ["prune", "w.onnx", "--method", "l1", "--amount", "0.5",
                                          "-o", "out.onnx"], setup=overlapping, models=())
case("external-data-negative-offset", ["inspect", "w.onnx"], setup=negative_offset, models=())
case("prune-o-name-too-long", PRUNE + ["-o", "n" * 240 + ".onnx"])
case("prune-file-size-limit", PRUNE + ["-o", "out.onnx"], fsize=4096)


def can_mount():
    """None when this process may mount a small tmpfs (root in most containers), else why not."""
    d = tempfile.mkdtemp()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", d], capture_output=True)
        return None if ok else "cannot mount a tmpfs here"
    finally:
        os.rmdir(d)


def small_disk(d):
    os.mkdir(os.path.join(d, "full"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                        os.path.join(d, "full")], capture_output=True, text=True)
    if r.returncode != 0:
        raise SetupError("mount: " + r.stderr.strip())


def unmount_small_disk(d, out, err):
    left = os.listdir(os.path.join(d, "full"))
    subprocess.run(["umount", os.path.join(d, "full")], capture_output=True)
    return [f"left on the full disk: {n}" for n in left]


def training_bn_model(rng):
    """One BatchNormalization node 'bn' in training mode on x [2, 3, 4, 4], its four tensors drawn
    from `rng` (python/tests/test_trust.py loads it in a session too)."""
    inits = [numpy_helper.from_array(rng.random(3).astype(np.float32) + 0.5, n)
             for n in ("scale", "bias", "mean", "var")]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"],
                            name="bn", training_mode=1)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)


def training_bn(d):
    rng = np.random.default_rng(0)
    save_raw(training_bn_model(rng), os.path.join(d, "m.onnx"))
    np.save(os.path.join(d, "in.npy"), rng.random((2, 3, 4, 4)).astype(np.float32))


case("run-batchnorm-in-training-mode", ["run", "m.onnx", "--input", "x=in.npy", "--out", "res"],
     setup=training_bn, models=(), allow=("res", "res/*"))
case("prune-disk-full", PRUNE + ["-o", "full/out.onnx"], setup=small_disk, skip=can_mount,
     check=unmount_small_disk)


def cache_env(d):
    return {"LOPPER_CACHE_DIR": os.path.join(d, "cache"), "LOPPER_KERNEL_CACHE": ""}


def cache_with(make):
    def setup(d):
        os.mkdir(os.path.join(d, "cache"))
        make(os.path.join(d, "cache", "kernels.json"))
    return setup


def wrong_shapes(d):
    """A real cache (from a first run), every choice's kernel a number, a machine a number."""
    os.mkdir(os.path.join(d, "cache"))
    rc, _, err = run_lopper(d, ["bench", "m.onnx", "--iters", "1"], env=cache_env(d))
    path = os.path.join(d, "cache", "kernels.json")
    if rc != 0 or not os.path.isfile(path):
        raise SetupError(f"the first bench made no kernel cache ({rc}): {err.strip()[-200:]}")
    cache = json.load(open(path))
    for machine in cache.values():
        for key, choice in machine.items():
            if isinstance(choice, dict):
                choice["kernel"] = 5
                choice["ms"] = "fast"
            machine[key] = choice if key != "probe" else {"ms": "x"}
    cache["a machine"] = 3
    json.dump(cache, open(path, "w"))


BENCH1 = ["bench", "m.onnx", "--iters", "1"]
case("kernel-cache-fifo-bench", BENCH1, setup=cache_with(os.mkfifo), env=cache_env,
     may_block=True)
case("kernel-cache-folder-bench", BENCH1, setup=cache_with(os.mkdir), env=cache_env)
case("kernel-cache-fifo-inspect", ["inspect", "m.onnx"], setup=cache_with(os.mkfifo),
     env=cache_env, may_block=True)
case("kernel-cache-wrong-shapes-bench", BENCH1, setup=wrong_shapes, env=cache_env,
     allow=("cache/kernels.json",), models=("cnn_small",))


HELD = {}   # case folder -> the descriptor holding the lock


def hold_checkpoint(d):
    import fcntl
    os.mkdir(os.path.join(d, "ck"))
    fd = os.open(os.path.join(d, "ck", ".lopper-checkpoint"), os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"A checkpoint folder of lopper train: epoch-N/ and latest are lopper's.\n")
    fcntl.flock(fd, fcntl.LOCK_EX)   # as a live run holds it
    HELD[d] = fd


def release_checkpoint(d, out, err):
    os.close(HELD.pop(d))
    return []


case("train-checkpoint-dir-held-by-another-run",
     TRAIN + ["-o", "out.onnx", "--checkpoint-dir", "ck"], setup=hold_checkpoint,
     check=release_checkpoint, data=True)


def bad_npy(d):
    with open(os.path.join(d, "in.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x10\x00{garbage       }\n" + b"\0" * 64)


case("npy-bad-header", ["run", "m.onnx", "--input", "image=in.npy", "--out", "res"], setup=bad_npy)
case("input-wrong-shape", ["run", "m.onnx", "--input", "image=in.npy", "--out", "res"],
     setup=lambda d: write_input(d, "in.npy", (2, 3)))
case("o-names-input-model", PRUNE + ["-o", "m.onnx"])
case("report-names-input-model", PRUNE + ["-o", "out.onnx", "--report", "m.onnx"])
case("unknown-command", ["frob", "m.onnx"])
case("unknown-flag", ["inspect", "m.onnx", "--frob"])
case("recipe-malformed-yaml", ["prune", "m.onnx", "-o", "out.onnx", "--recipe", "r.yaml"],
     setup=lambda d: open(os.path.join(d, "r.yaml"), "w").write(
         "defaults:\n  method: [l1\n  amount: 0.5\n"))
case("recipe-unknown-method", ["prune", "m.onnx", "-o", "out.onnx", "--recipe", "r.yaml"],
     setup=lambda d: open(os.path.join(d, "r.yaml"), "w").write(
         "defaults:\n  method: frob\n  amount: 0.5\n"))
case("usage-prune-structured-recipe-and-amount",
     ["prune", "m.onnx", "--structured", "channel", "--recipe", "r.yaml", "--amount", "0.5", "-o",
      "out.onnx"],
     setup=lambda d: open(os.path.join(d, "r.yaml"), "w").write("defaults:\n  amount: 0.5\n"))
case("data-unknown-kind", TRAIN[:2] + ["--data", "foo:bar", "--epochs", "1", "-o", "out.onnx"])
case("usage-prune-structured-activation-without-data",
     ["prune", "m.onnx", "--structured", "channel", "--method", "activation", "--amount", "0.5",
      "-o", "out.onnx"])
case("usage-prune-structured-expert-onnx",
     ["prune", "m.onnx", "--structured", "expert", "--method", "reap", "--amount", "0.25", "-o",
      "out.onnx"])
case("usage-prune-structured-block-without-data",
     ["prune", "m.onnx", "--structured", "block", "--amount", "1", "-o", "out.onnx"])
case("usage-prune-structured-block-with-scope",
     ["prune", "m.onnx", "--structured", "block", "--method", "random", "--amount", "1",
      "--scope", "global", "-o", "out.onnx"])
case("prune-structured-block-none-in-model",
     ["prune", "m.onnx", "--structured", "block", "--method", "random", "--amount", "1", "-o",
      "out.onnx"])

BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "two cases share a name"
assert set(EXPECT) == set(BY_NAME), f"EXPECT rows without a case: {set(EXPECT) - set(BY_NAME)}"


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

def judge(c, d):
    """(status, problems) of one case run in folder d: status PASS, FAIL or SKIP."""
    codes, words = EXPECT[c.name]
    codes = (codes,) if isinstance(codes, int) else tuple(codes)
    for which in c.models:
        copy_model(d, which)
    if c.data:
        write_data(d)
    try:
        if c.setup:
            c.setup(d)
    except SetupError as e:
        return "FAIL", [str(e)]
    before = snapshot(d)
    dev_before = set(os.listdir("/dev")) if c.watch_dev else set()
    t0 = time.monotonic()
    rc, out, err = run_lopper(d, c.args, c.timeout, c.env(d) if c.env else None, c.fsize)
    took = time.monotonic() - t0
    problems = []
    if rc is None:
        problems.append(f"HANG: still running after {c.timeout or TIMEOUT:.0f} s, killed")
    elif rc < 0:
        problems.append(f"killed by signal {-rc} ({signal.Signals(-rc).name})")
    elif rc not in codes:
        problems.append(f"exit {rc}, want {' or '.join(map(str, codes))}")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if words is not None:
        hit = [ln for ln in lines if any(w.lower() in ln.lower() for w in words)]
        if 0 not in codes and len(lines) != 1:
            problems.append(f"{len(lines)} lines on stderr, want 1")
        if not hit:
            problems.append(f"no stderr line with any of {words}")
    if lines and problems:
        problems.append("stderr: " + " | ".join(ln.strip() for ln in lines[-3:])[:400])
    after = snapshot(d)
    problems += diff_snapshots(before, after, c.allow)
    if c.watch_dev:
        new = [n for n in set(os.listdir("/dev")) - dev_before if "null" in n]
        problems += [f"left behind: /dev/{n}" for n in sorted(new)]
    if c.check and rc is not None:
        try:
            problems += c.check(d, out, err)
        except Exception as e:  # noqa: BLE001 - a check that breaks is a failure of the case
            problems.append(f"check raised {type(e).__name__}: {e}")
    if not dev_null_ok():
        problems.append("/dev/null is no longer a character device")
        repair_dev_null()
    return ("FAIL" if problems else "PASS"), problems + ([f"({took:.1f} s)"] if problems else [])


def run_case(c, root, keep, results, lock):
    reason = c.skip() if c.skip else None
    if reason is None and c.depends:
        with lock:
            dep = results.get(c.depends)
        if dep != "PASS":
            reason = (f"{c.depends} did not pass ({dep or 'not run'}): /dev/null is only named "
                      "once the command refuses a FIFO")
    if reason:
        status, problems = "SKIP", [reason]
    else:
        d = tempfile.mkdtemp(prefix=c.name.replace(":", "_") + ".", dir=root)
        try:
            status, problems = judge(c, d)
        except Exception as e:  # noqa: BLE001 - the harness itself failed on this case
            status, problems = "FAIL", [f"harness error {type(e).__name__}: {e}"]
        if status == "PASS" or not keep:
            remove_tree(d)
    with lock:
        results[c.name] = status
        line = f"{status} {c.name}"
        if problems:
            line += ": " + "; ".join(problems)
        print(line, flush=True)
    return status


def remove_tree(d):
    """rmtree that first makes read-only folders writable (never follows links out)."""
    for top, dirs, _ in os.walk(d):
        for n in dirs:
            p = os.path.join(top, n)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
    shutil.rmtree(d, ignore_errors=True)


def main():
    global LOPPER, FIXTURES, TIMEOUT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lopper")
    ap.add_argument("fixtures")
    ap.add_argument("--only", help="comma-separated case names (glob patterns)")
    ap.add_argument("--list", action="store_true", help="list the cases and their expectations")
    ap.add_argument("--keep", action="store_true", help="keep the folders of failed cases")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a hang (60)")
    ap.add_argument("--jobs", type=int, default=max(2, min(4, os.cpu_count() or 1)),
                    help="cases run at once (serial ones run alone at the end)")
    a = ap.parse_args()
    LOPPER, FIXTURES, TIMEOUT = os.path.abspath(a.lopper), os.path.abspath(a.fixtures), a.timeout

    if a.list:
        for c in CASES:
            codes, words = EXPECT[c.name]
            print(f"{c.name:45s} exit {codes}  {words or ''}  lopper {' '.join(c.args)}")
        return 0

    chosen = CASES
    if a.only:
        pats = a.only.split(",")
        chosen = [c for c in CASES if any(fnmatch.fnmatchcase(c.name, p) for p in pats)]
        if not chosen:
            print(f"no case matches {a.only}; --list shows them", file=sys.stderr)
            return 2
        # a case that depends on another runs it first
        names = {c.name for c in chosen}
        chosen = [BY_NAME[c.depends] for c in chosen
                  if c.depends and c.depends not in names] + chosen
    if not os.access(LOPPER, os.X_OK):
        print(f"no lopper binary at {LOPPER}", file=sys.stderr)
        return 2
    if not dev_null_ok():
        print("/dev/null is not a character device before the run; refusing to start",
              file=sys.stderr)
        return 2

    t0 = time.monotonic()
    results, lock = {}, threading.Lock()
    root = tempfile.mkdtemp(prefix="lopper-robustness.")
    try:
        blocking = [c for c in chosen if c.may_block and not c.serial]
        parallel = [c for c in chosen if not c.serial and not c.may_block]
        serial = [c for c in chosen if c.serial]
        run = lambda c: run_case(c, root, a.keep, results, lock)  # noqa: E731
        with concurrent.futures.ThreadPoolExecutor(max(1, len(blocking))) as waiting, \
                concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            futures = [waiting.submit(run, c) for c in blocking]
            futures += [pool.submit(run, c) for c in parallel]
            for f in futures:
                f.result()
        for c in serial:   # after the others: the FIFO cases they depend on have run
            run_case(c, root, a.keep, results, lock)
    finally:
        if not a.keep:
            remove_tree(root)
    counts = {s: sum(1 for v in results.values() if v == s) for s in ("PASS", "FAIL", "SKIP")}
    failed = sorted(n for n, s in results.items() if s == "FAIL")
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"in {time.monotonic() - t0:.0f} s" + (f" (folders kept under {root})" if a.keep else ""))
    if failed:
        print("failed: " + " ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
