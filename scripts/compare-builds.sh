#!/bin/bash
# compare-builds.sh OLD_LOPPER NEW_LOPPER [FIXTURES]: runs one battery of CLI commands (every
# pruning method, structured by channel and head on CNNs and transformers, targets, sensitivity,
# training schedules, inspect, convert, run) with each binary, and compares what they write:
# models and .npy outputs byte for byte, JSON reports without their timings and paths, stdout,
# exit codes. Prints each difference; exits 1 if there is any. For refactors: behaviour unchanged.
set -u
OLD=$(realpath "$1"); NEW=$(realpath "$2")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
F=$(realpath "${3:-$ROOT/build/fixtures}"); E=$ROOT/examples
PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
battery() {  # battery BIN DIR
  local BIN=$1 OUT=$2
  mkdir -p "$OUT" && cd "$OUT" || exit 1
  export LOPPER_KERNEL_CACHE=off OMP_NUM_THREADS=2
  "$PY" -c "
import numpy as np
r = np.random.default_rng(0)
np.save('x.npy', r.random((64, 1, 28, 28), dtype=np.float32)); np.save('y.npy', r.integers(0, 10, 64))
np.save('ids.npy', r.integers(0, 1000, (8, 16)))"
  local D="--data npy:x.npy,y.npy" T="--data tokens:ids.npy --calib-batches 4 --exclude lm_head"
  run() { local name=$1; shift; echo "$name: $BIN $*" >> commands.txt
    "$BIN" "$@" > "$name.stdout" 2> "$name.stderr"; echo "$name rc=$?" >> rc.txt; }
  runj() { run "$@"; mv "$1.stdout" "$1.json"; }  # prints JSON: compared without its timings
  run l1 prune $E/lenet5.onnx -o l1.onnx --method l1 --amount 0.7 --scope global --json
  run lamp prune $E/lenet5.onnx -o lamp.onnx --method lamp --amount 0.7 --scope global
  run nm prune $E/lenet5.onnx -o nm.onnx --method l1 --pattern 2:4
  run block prune $E/lenet5.onnx -o block.onnx --method l1 --amount 0.8 --pattern block:8x1
  run row prune $E/lenet5.onnx -o row.onnx --method l1 --amount 0.3 --pattern row --norm 2
  run rand prune $E/lenet5.onnx -o rand.onnx --method random --amount 0.5 --seed 1
  run taylor prune $E/lenet5.onnx -o taylor.onnx --method taylor --amount 0.5 $D --calib-batches 4
  run recipe prune $E/lenet5.onnx -o recipe.onnx --recipe $E/recipe.yaml
  run s_resnet prune $F/resnet18.dynamo.onnx -o s_resnet.onnx --structured channel --method l1 --amount 0.5
  run s_mobile prune $F/mobilenet_v2.ts.onnx -o s_mobile.onnx --structured channel --method l2 --amount 0.3 --scope global --round-to 8
  run s_bert prune $F/bert.dynamo.onnx -o s_bert.onnx --structured head --method l1 --amount 0.5
  run s_gpt2 prune $F/gpt2.dynamo.onnx -o s_gpt2.onnx --structured channel --method l1 --amount 0.4
  run s_llama prune $F/llama.dynamo.onnx -o s_llama.onnx --structured head --method l1 --amount 0.5
  run s_llama_ts prune $F/llama.ts.onnx -o s_llama_ts.onnx --structured channel --method l1 --amount 0.5
  run s_dense prune $F/densenet121.dynamo.onnx -o s_dense.onnx --structured channel --method fpgm --amount 0.3
  run s_shuffle prune $F/shufflenet_v2_x0_5.dynamo.onnx -o s_shuffle.onnx --structured channel --method l1 --amount 0.3
  run s_vit prune $F/vit_b_16.dynamo.onnx -o s_vit.onnx --structured head --method l1 --amount 0.25
  run wanda prune $F/llama.dynamo.onnx -o wanda.onnx --method wanda --amount 0.5 $T
  run sparsegpt prune $F/llama.dynamo.onnx -o sparsegpt.onnx --method sparsegpt --pattern 2:4 $T
  run target prune $E/lenet5.onnx -o target.onnx --target-macs 0.5
  run target_s prune $F/resnet18.ts.onnx -o target_s.onnx --target-params 0.6 --structured channel
  run sens sensitivity $E/lenet5.onnx $D -o sens.json --eval-batches 2 --amounts 0.3,0.6
  run agp train $E/lenet5.onnx $D -o agp.onnx --epochs 2 --batch-size 16 --schedule agp --prune-method l1 --prune-amount 0.6 --start-epoch 0 --end-epoch 1 --no-eval
  run rounds train $E/lenet5.onnx $D -o rounds.onnx --epochs 2 --batch-size 16 --schedule iterative --rounds 2 --epochs-per-round 1 --prune-structured channel --prune-method l1 --prune-amount 0.5 --no-eval
  run inspect inspect $F/resnet18.dynamo.onnx --json
  run convert convert $E/lenet5.onnx -o convert.onnx
  run run run $F/small_cnn.ts.onnx -i input=$F/small_cnn.input_0.npy -o runout
  run inspect_text inspect $E/lenet5.onnx --shape image=2x1x28x28
  run convert_sparse convert l1.onnx -o convert_sparse.onnx --sparse-initializers
  run convert_external convert $E/lenet5.onnx -o convert_external.onnx --external-data --dense
  run convert_both convert $E/lenet5.onnx -o convert_both.onnx --sparse-initializers --dense
  runj bench bench $E/lenet5.onnx --json --iters 3 --warmup 1 --profile --batch 2
  run bench_zero bench $E/lenet5.onnx --iters 0
  runj eval eval $E/lenet5.onnx $D --batch-size 16 --json
  runj compare compare $E/lenet5.onnx l1.onnx $D --iters 3 --json -o compare_out.json --report compare.html
  run compare_zero compare $E/lenet5.onnx l1.onnx --batch 0
}
(battery "$OLD" "$WORK/old") > /dev/null 2>&1
(battery "$NEW" "$WORK/new") > /dev/null 2>&1
"$PY" - "$WORK/old" "$WORK/new" <<'P'
import json, pathlib, sys
import numpy as np
old, new = map(pathlib.Path, sys.argv[1:])
def plain(o):  # a JSON report without what differs between any two runs
    if isinstance(o, dict) and 'profile' in o:  # bench: ops and nodes slowest first, as timed
        o = dict(o, profile=sorted(o['profile'], key=lambda p: p['op']),
                 profile_nodes=sorted(o['profile_nodes'], key=lambda p: p['node']))
    if isinstance(o, dict):
        return {k: plain(v) for k, v in o.items()
                if k not in ('seconds', 'samples_per_s', 'data', 'out', 'model', 'ms', 'latency_ms',
                             'throughput_per_s', 'spread', 'spread_wide', 'contention',
                             'contended', 'warning', 'ms_per_run', 'latency_spread',
                             'latency_spread_wide', 'latency_contended', 'latency_warning')
                and not k.endswith('_ms')}
    return [plain(v) for v in o] if isinstance(o, list) else o
bad = 0
names = sorted({p.relative_to(old) for p in old.rglob('*') if p.is_file()} |
               {p.relative_to(new) for p in new.rglob('*') if p.is_file()})
for n in names:
    a, b = old / n, new / n
    if n.suffix == '.stderr' or n.name == 'commands.txt':
        continue  # progress lines with timings; the binary's path
    if n.suffix == '.html':
        continue  # a report holds its timings and the command line
    if not a.exists() or not b.exists():
        print(f'only in {"new" if b.exists() else "old"}: {n}'); bad += 1; continue
    if n.suffix == '.json':
        same = plain(json.loads(a.read_text())) == plain(json.loads(b.read_text()))
    elif n.suffix == '.npy':  # the kernels are timed anew by each run: float rounding may differ
        x, y = np.load(a), np.load(b)
        same = x.shape == y.shape and np.allclose(x, y, rtol=1e-5, atol=1e-6)
    else:
        same = a.read_bytes() == b.read_bytes()
    if not same:
        print(f'differs: {n}'); bad += 1
runs = len((old / 'rc.txt').read_text().splitlines())
print(f'{runs} commands, {len(names)} files: {bad} differ')
sys.exit(1 if bad else 0)
P
