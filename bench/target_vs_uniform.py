"""Pruning to a target vs uniform amounts, after the same fine-tune: Fashion-MNIST test
top-1 of per-layer amounts chosen by `lopper prune --target-*` against one amount for every layer,
at the same cost.

Per model and seed, lopper trains the dense model from examples/<model>.onnx, prunes it in each arm
below, fine-tunes every pruned model with the SAME recipe (epochs, LR, seed; SGD momentum 0.9,
batch 128, cosine LR per epoch, pixels in [0, 1]; pruned weights held at zero by lopper's trainer)
and evaluates it on the test split, right after pruning and after fine-tuning.

resnet_fmnist (examples/make_examples.py: a small ResNet with BatchNorm and residual Adds), whole
channels removed (`--structured channel`, l1 importance), to half the MACs:
  target   --target-macs 0.5 --structured channel --data fashion-mnist: per-group amounts from
           sensitivity curves measured on the same 16 train batches of 64 (--eval-batches 16
           --batch-size 64)
  uniform  --structured channel --amount A (every group loses the same share), A bisected so its
           MACs come as close to target's measured MACs as the channel granularity allows
  global   --target-macs 0.5 --structured channel without data: the global channel ranking
lenet300_100 (LeNet-300-100), unstructured, 95% of the prunable weights removed:
  target   --target-params T --data fashion-mnist: per-layer amounts from sensitivity curves
           measured on train batches (as above)
  uniform  --method l1 --amount 0.95 (each layer loses 95%, local scope)
  lamp     --target-params T without data (LAMP scores)
  global   --method l1 --amount 0.95 --scope global (global magnitude)
  T is the share of ALL parameters (biases included, which are never pruned) that leaves exactly
  as many nonzero weights as --amount 0.95 does, so every arm keeps the same count.
Epochs and LRs: CONFIG below. Accuracy: test top-1 (10,000 images). Mean over seeds.

Threads: every lopper process gets --threads T (train) or OMP_NUM_THREADS=T (the others), and
--jobs J runs J (model, seed) pairs at once. Only accuracy is measured here, and the default
(T = 1, J = 2) suits a shared 2-core machine: with 2 OpenMP threads on 2 busy cores a training
epoch can take 20-80x longer than with one (OpenMP threads wait on each other at every barrier),
while one thread per process is never slower than its share of the machine.

Usage: bench/target_vs_uniform.py --lopper build/lopper [--models resnet_fmnist,lenet300_100]
       [--seeds 0,1] [--threads 1] [--jobs 2] [--json docs/bench-target.json] [--workdir DIR]
"""

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from options import seeds_parser  # bench/options.py
from results import mean, save_json  # bench/results.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Per model: dense epochs and LR, fine-tune epochs and LR (the same for every arm).
# resnet_fmnist: one epoch takes 100-160 s on one thread of the shared 2-core machine, so 4 dense epochs at
# 0.1 (the usual ResNet LR with BatchNorm; 91.4% test top-1) and 3 fine-tune epochs at a tenth of it keep
# the two seeds, run side by side, near 30 minutes. lenet300_100: bench/accuracy.py's recipe.
CONFIG = {
    "resnet_fmnist": dict(kind="structured", epochs=4, lr=0.1, ft_epochs=3, ft_lr=0.01, target_macs=0.5,
                          eval_batches=16, sens_batch=64),
    "lenet300_100": dict(kind="unstructured", epochs=10, lr=0.05, ft_epochs=5, ft_lr=0.05, amount=0.95,
                         eval_batches=16, sens_batch=64),
}
ARMS = {"structured": ["target", "uniform", "global"], "unstructured": ["target", "uniform", "lamp", "global"]}


PRINT_LOCK = threading.Lock()
STOP = threading.Event()  # set when one (model, seed) failed: the others stop at their next command


class Failed(Exception):
    pass


class Runner:
    """Runs one (model, seed): its lopper commands, their log, its progress lines."""

    def __init__(self, a, tmp, tag):
        self.a, self.tmp, self.tag, self.commands = a, tmp, tag, []
        self.env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))

    def say(self, msg):
        with PRINT_LOCK:
            print(f"[{self.tag}] {msg}", flush=True)

    def sh(self, cmd):
        shown = " ".join(shlex.quote(c) for c in cmd).replace(self.tmp, "$TMP")
        if STOP.is_set():
            raise Failed("stopped")
        self.commands.append(shown)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            raise Failed(f"{shown} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        return r, time.perf_counter() - t0

    def path(self, name):
        return os.path.join(self.tmp, name)

    def train(self, src, out, epochs, lr, seed):
        """Trains; returns (test top-1 %, seconds of the epochs themselves)."""
        self.sh([self.a.lopper, "train", src, "--data", "fashion-mnist", "-o", out, "--epochs", str(epochs),
                 "--lr", str(lr), "--lr-schedule", "cosine", "--momentum", "0.9", "--batch-size", "128",
                 "--seed", str(seed), "--threads", str(self.a.threads)])
        with open(out + ".train.json") as f:
            j = json.load(f)
        return 100 * j["eval"]["top1"], sum(e["seconds"] for e in j["epochs"])

    def top1(self, path):
        r, _ = self.sh([self.a.lopper, "eval", path, "--data", "fashion-mnist", "--json", "--batch-size", "1000"])
        return 100 * json.loads(r.stdout)["top1"]

    def prune(self, src, out, *args):
        _, wall = self.sh([self.a.lopper, "prune", src, "-o", out, *args])
        with open(out + ".report.json") as f:
            return json.load(f), wall

    def cost(self, path):
        """params, nonzero params, prunable weights and their nonzeros, MACs (dense and on nonzero weights),
        output channels per conv/linear layer."""
        r, _ = self.sh([self.a.lopper, "inspect", path, "--json"])
        j = json.loads(r.stdout)
        L = j["layers"]
        return dict(params=j["params"], nonzero=j["nonzero"], weights=sum(l["params"] for l in L),
                    weights_nonzero=sum(l["nonzero"] for l in L), macs=j["macs"],
                    macs_nonzero=round(sum(l["macs"] * l["nonzero"] / l["params"] for l in L)),
                    channels={l["name"]: l["shape"][0] for l in L})


def structured_arms(R, c, dense, seed, model):
    """resnet_fmnist: returns {arm: (pruned path, extra record)}."""
    arms = {}
    out = R.path(f"{model}.s{seed}.target.onnx")
    rep, wall = R.prune(dense, out, "--target-macs", str(c["target_macs"]), "--structured", "channel",
                        "--data", "fashion-mnist", "--eval-batches", str(c["eval_batches"]),
                        "--batch-size", str(c["sens_batch"]), "--seed", str(seed))
    goal = rep["macs"]  # the uniform arm matches the MACs this arm measures
    arms["target"] = (out, dict(prune_s=wall, target=rep["target"],
                                group_amounts={l["name"]: l["amount"] for l in rep["layers"]}))
    R.say(f"target: {rep['macs']} MACs ({rep['macs'] / rep['macs_before']:.3f}), {wall:.0f}s")

    # uniform: MACs fall (weakly) as the amount grows; bisect to the step that holds target's MACs.
    out = R.path(f"{model}.s{seed}.uniform.onnx")
    probes = {}

    def macs_at(a):
        if a not in probes:
            r, _ = R.prune(dense, out, "--structured", "channel", "--amount", f"{a:.6f}", "--json")
            probes[a] = r["macs"]
        return probes[a]

    lo, hi = 0.0, 0.95  # macs_at(lo) >= goal >= macs_at(hi)
    probes[0.0] = rep["macs_before"]
    for _ in range(20):
        if hi - lo < 1e-4:
            break
        mid = (lo + hi) / 2
        m = macs_at(mid)
        if abs(m - goal) <= 0.001 * goal:
            lo = hi = mid
            break
        if m >= goal:
            lo = mid
        else:
            hi = mid
    amount = min((lo, hi), key=lambda a: (abs(macs_at(a) - goal), a))
    rep, wall = R.prune(dense, out, "--structured", "channel", "--amount", f"{amount:.6f}", "--json")
    arms["uniform"] = (out, dict(prune_s=wall, amount=amount, macs_goal=goal,
                                 probes=sorted([a, m] for a, m in probes.items())))
    R.say(f"uniform: amount {amount:.4f} -> {rep['macs']} MACs ({rep['macs'] / goal - 1:+.2%} vs target's), "
          f"{len(probes) - 1} probes")

    out = R.path(f"{model}.s{seed}.global.onnx")
    rep, wall = R.prune(dense, out, "--target-macs", str(c["target_macs"]), "--structured", "channel")
    arms["global"] = (out, dict(prune_s=wall, target=rep["target"],
                                group_amounts={l["name"]: l["amount"] for l in rep["layers"]}))
    R.say(f"global: {rep['macs']} MACs")
    return arms


def unstructured_arms(R, c, dense, seed, model):
    """lenet300_100: returns {arm: (pruned path, extra record)}."""
    arms = {}
    out = R.path(f"{model}.s{seed}.uniform.onnx")
    rep, wall = R.prune(dense, out, "--method", "l1", "--amount", str(c["amount"]), "--json")
    arms["uniform"] = (out, dict(prune_s=wall))
    cost = R.cost(out)
    # The share of all params that keeps as many nonzero weights as the uniform arm (biases are never pruned);
    # + 0.5 so that share * params lands between two counts, not a rounding error below the one meant.
    share = (cost["weights_nonzero"] + cost["params"] - cost["weights"] + 0.5) / cost["params"]

    out = R.path(f"{model}.s{seed}.target.onnx")
    rep, wall = R.prune(dense, out, "--target-params", f"{share:.9f}", "--data", "fashion-mnist",
                        "--eval-batches", str(c["eval_batches"]), "--batch-size", str(c["sens_batch"]),
                        "--seed", str(seed))
    arms["target"] = (out, dict(prune_s=wall, target=rep["target"], share=share,
                                layer_amounts={l["name"]: l["amount"] for l in rep["layers"]}))

    out = R.path(f"{model}.s{seed}.lamp.onnx")
    rep, wall = R.prune(dense, out, "--target-params", f"{share:.9f}")
    arms["lamp"] = (out, dict(prune_s=wall, target=rep["target"], share=share,
                              layer_amounts={l["name"]: l["amount"] for l in rep["layers"]}))

    out = R.path(f"{model}.s{seed}.global.onnx")
    _, wall = R.prune(dense, out, "--method", "l1", "--amount", str(c["amount"]), "--scope", "global", "--json")
    arms["global"] = (out, dict(prune_s=wall))
    R.say(f"pruned: share of params kept {share:.6f}")
    return arms


def run_seed(a, tmp, model, seed):
    R = Runner(a, tmp, f"{model} seed {seed}")
    c = CONFIG[model]
    src = os.path.join(ROOT, "examples", model + ".onnx")
    t0 = time.perf_counter()
    dense = R.path(f"{model}.s{seed}.dense.onnx")
    R.say(f"dense: {c['epochs']} epochs at lr {c['lr']} ...")
    top1_dense, secs = R.train(src, dense, c["epochs"], c["lr"], seed)
    res = dict(seed=seed, dense=dict(top1=top1_dense, train_s=secs, **R.cost(dense)))
    R.say(f"dense top-1 {top1_dense:.2f}% ({secs:.0f}s training)")
    arms = (structured_arms if c["kind"] == "structured" else unstructured_arms)(R, c, dense, seed, model)
    for arm in ARMS[c["kind"]]:
        pruned, extra = arms[arm]
        before = R.top1(pruned)
        ft = R.path(f"{model}.s{seed}.{arm}.ft.onnx")
        after, secs = R.train(pruned, ft, c["ft_epochs"], c["ft_lr"], seed)
        cost = R.cost(ft)
        res[arm] = dict(top1_pruned=before, top1=after, delta=after - top1_dense, finetune_s=secs, **cost, **extra)
        R.say(f"{arm:8s} nonzero {cost['nonzero']:6d}  MACs {cost['macs_nonzero']:8d}  top-1 pruned {before:6.2f}%  "
              f"fine-tuned {after:6.2f}% ({after - top1_dense:+.2f})  ({secs:.0f}s fine-tune)")
    res["wall_s"] = time.perf_counter() - t0
    res["commands"] = R.commands
    R.say(f"{res['wall_s']:.0f}s")
    return res


def main():
    ap = seeds_parser(__doc__, "resnet_fmnist,lenet300_100", "each model runs once per seed; the table has the means")
    ap.add_argument("--threads", type=int, default=1, help="threads per lopper process (see above)")
    ap.add_argument("--jobs", type=int, default=2, help="(model, seed) pairs run at once")
    ap.add_argument("--json")
    ap.add_argument("--workdir", help="keep every model made here (default: a temporary folder, removed)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    models = a.models.split(",")
    for m in models:
        if m not in CONFIG:
            ap.error(f"unknown model {m!r}; one of: {', '.join(CONFIG)}")
    with open(a.lopper, "rb") as f:  # which binary ran (the build folder may be rebuilt meanwhile: copy it first)
        sha = hashlib.sha256(f.read()).hexdigest()
    lopper = dict(path=a.lopper, sha256=sha, git_head=subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip())
    t0 = time.perf_counter()
    if a.workdir:
        os.makedirs(a.workdir, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(a.jobs) as pool:
        tmp = os.path.abspath(a.workdir) if a.workdir else scratch
        futures = {m: [pool.submit(run_seed, a, tmp, m, s) for s in seeds] for m in models}
        try:
            results = {m: [f.result() for f in fs] for m, fs in futures.items()}
        except Failed as e:
            STOP.set()
            sys.exit(str(e))
    wall = time.perf_counter() - t0

    print(f"\nFashion-MNIST test top-1 (%), mean of seeds {a.seeds}, {a.threads} thread(s) per process, {a.jobs} at "
          f"once, {wall / 60:.1f} min in all")
    print(f"{'model':14s} {'arm':8s} {'params':>8s} {'nonzero':>8s} {'MACs':>9s} {'MACs nz':>9s} {'pruned':>7s} "
          f"{'tuned':>7s} {'vs dense':>9s}  per seed")
    summary = {}
    for model, runs in results.items():
        for arm in ["dense"] + ARMS[CONFIG[model]["kind"]]:
            rows = [r[arm] for r in runs]
            s = {k: mean([r[k] for r in rows]) for k in ("params", "nonzero", "macs", "macs_nonzero", "top1")}
            if arm != "dense":
                s.update(top1_pruned=mean([r["top1_pruned"] for r in rows]), delta=mean([r["delta"] for r in rows]))
            s["top1_seeds"] = [r["top1"] for r in rows]
            summary[f"{model}/{arm}"] = s
            pr = f"{s['top1_pruned']:7.2f}" if arm != "dense" else f"{'':7s}"
            dl = f"{s['delta']:+9.2f}" if arm != "dense" else f"{'':9s}"
            print(f"{model:14s} {arm:8s} {s['params']:8.0f} {s['nonzero']:8.0f} {s['macs']:9.0f} {s['macs_nonzero']:9.0f} "
                  f"{pr} {s['top1']:7.2f} {dl}  {' '.join(f'{t:.2f}' for t in s['top1_seeds'])}")
    if a.json:
        meta = dict(machine=f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} cores", lopper=lopper,
                    python=sys.version.split()[0], seeds=seeds, threads=a.threads, jobs=a.jobs, config=CONFIG,
                    wall_s=wall, command=" ".join(shlex.quote(x) for x in sys.argv))
        save_json(a.json, dict(meta=meta, summary=summary, runs=results), indent=1)


if __name__ == "__main__":
    main()
