#!/usr/bin/env bash
# On a GPU machine: builds lopper against that machine's PyTorch with CUDA, runs the GPU tests, the
# GPU benchmarks, the CLI on --device cuda, data parallel on NCCL and the Python package on CUDA,
# and prints one table (also written to gpu-check.md). Each stage runs under its own time limit, a
# failed stage does not stop the next, and the exit status is non-zero when any failed.
#
#   here:        scripts/gpu-debs.sh                           # once: the Debian packages to carry
#   GPU machine: scripts/gpu-check.sh [--budget S] [--stages a,b] [--quick]   # .gpu-debs carried
#
# --budget S: stop starting stages once S seconds have passed (each stage's limit is cut to what is
# left), so that a lease's time limit never kills the run before its table is written. --stages:
# only these (configure and build always run; they are quick when the build is up to date).
# The GPU machine has python3 with torch, onnx, torchvision, CMake, ninja and nvcc, but no Debian
# -dev packages and no network: they come unpacked from .gpu-debs into a private prefix. Logs and
# JSON go to $OUT when it is set (the device tool: they come back even if the run is killed), else
# to build-gpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0 budget=100000 only=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --budget) budget=$2; shift ;;
    --stages) only=",$2,"; shift ;;
    *) echo "gpu-check: unknown argument $1"; exit 2 ;;
  esac
  shift
done
t_start=$(date +%s)
B=build-gpu
mkdir -p $B
D=${OUT:-$B}
log=$D/gpu-check.log
touch "$log"
status=0
failed=()
skipped=()
selected() {  # selected NAME: whether --stages names it (configure and build always run)
  [ -z "$only" ] || [[ $only == *",$1,"* ]] || [ "$1" = configure ] || [ "$1" = build ]
}
stage() {  # stage NAME LIMIT_S CMD...: runs CMD with a time limit, logging it, noting a failure
  local name=$1 limit=$2
  shift 2
  selected "$name" || return 0
  local t0 left
  t0=$(date +%s)
  left=$(( budget - (t0 - t_start) ))
  if [ "$left" -lt 20 ]; then
    echo "[gpu-check] SKIPPED $name: the budget is spent" | tee -a "$log"
    skipped+=("$name")
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[gpu-check] $name ($(( t0 - t_start )) s in, limit $limit s)" | tee -a "$log"
  if timeout --kill-after=5 "$limit" "$@" >> "$log" 2>&1; then
    echo "[gpu-check] $name ok in $(( $(date +%s) - t0 )) s" | tee -a "$log"
  else
    local rc=$?
    echo "[gpu-check] FAILED ($rc) $name after $(( $(date +%s) - t0 )) s" | tee -a "$log"
    failed+=("$name")
    status=1
  fi
}

py=${LOPPER_PYTHON:-$(command -v python3)}
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'" ||
  { echo "gpu-check: needs a CUDA GPU and a python3 with torch"; exit 1; }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  "$py" -c "import torch, onnx; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'onnx', onnx.__version__)"
  command -v nvcc && nvcc --version | tail -2
  command -v cmake ninja && cmake --version | head -1
  nproc
} 2>&1 | tee -a "$log"

prefix=/tmp/lopper-gpu-prefix
cmake_extra=()
# NOTE: unpacked even where the image has some of them (it has protobuf, zlib, libpng, libjpeg):
# everything is then found in the prefix first, one consistent set.
if [ -d .gpu-debs ]; then
  echo "[gpu-check] unpacking $(ls .gpu-debs/*.deb | wc -l) Debian packages into $prefix"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in .gpu-debs/*.deb; do dpkg-deb -x "$f" "$prefix"; done
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$prefix/usr/bin:$PATH"
  cmake_extra+=(-DCMAKE_PREFIX_PATH="$prefix/usr"
                -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc"
                -DLOPPER_CHARTJS="$prefix/usr/share/javascript/chart.js/chart.min.js"
                -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include")
fi
# lopper's own CUDA kernels need nvcc, wherever the image puts it.
nvcc_path=$(command -v nvcc || true)
[ -z "$nvcc_path" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_path=/usr/local/cuda/bin/nvcc
[ -n "$nvcc_path" ] && cmake_extra+=(-DCMAKE_CUDA_COMPILER="$nvcc_path")
# The Python package needs the interpreter's headers; build it only where they are.
pyinc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
python_module=OFF
[ -f "$pyinc/Python.h" ] && python_module=ON
targets=(lopper lopper_gpu_tests)
selected kernel-bench && targets+=(lopper_kernel_bench)
if [ $python_module = ON ] && selected python; then
  targets+=(lopper_python)
fi

fmnist_dir=/usr/share/datasets/fashion-mnist
[ -d $fmnist_dir ] || fmnist_dir=$prefix/usr/share/datasets/fashion-mnist
fmnist=fashion-mnist
[ -d /usr/share/datasets/fashion-mnist ] || fmnist="idx:$fmnist_dir"

# The fixtures the GPU tests and the CLI read, exported while the build runs (once per machine).
fixtures_pid=""
if ! [ -f $B/fixtures/bert.ts.onnx ]; then
  "$py" tests/fixtures/make_models.py $B/fixtures --only mlp,small_cnn,resnet18,mobilenet_v2,bert \
    > $D/fixtures.log 2>&1 &
  fixtures_pid=$!
fi

stage configure 300 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOPPER_PYTHON="$py" \
  -DTORCH_CUDA_ARCH_LIST="9.0" -DLOPPER_PYTHON_MODULE=$python_module "${cmake_extra[@]}"
# -k 0: every compile error at once, not the first.
stage build 900 bash -c "cmake --build $B -j $(nproc) --target ${targets[*]} -- -k 0 > $D/build.log 2>&1 ||
  { grep -E -B2 -A12 'error|FAILED' $D/build.log | head -300; exit 1; }"
if ! [ -x $B/lopper ]; then
  echo "[gpu-check] no lopper was built: the stages after the build are not run" | tee -a "$log"
  exit 1
fi
[ -n "$fixtures_pid" ] && stage fixtures 600 bash -c "while kill -0 $fixtures_pid 2>/dev/null; do sleep 1; done;
  tail -5 $D/fixtures.log; ls $B/fixtures/bert.ts.onnx"

# Each GPU test in its own process (a sticky CUDA error, such as an illegal instruction, fails
# that test alone), its whole output in $D/gpu-tests.log.
gpu_tests() {
  local bin=$B/tests/lopper_gpu_tests rc=0 t
  for t in $($bin --gtest_list_tests --gtest_filter='*Cuda*:*Gpu*:Cli.Bench*' |
             awk '/^[^ ]/ {s = $1} /^  / {print s $1}'); do
    echo "===== $t" >> $D/gpu-tests.log
    stdbuf -oL $bin --gtest_filter="$t" >> $D/gpu-tests.log 2>&1
    local s=$?
    if [ $s = 0 ]; then
      echo "[gpu-test] passed: $t"
    else  # 128 + N: killed by signal N (139: a segfault)
      echo "[gpu-test] FAILED: $t (exit status $s)"; rc=1
      awk -v t="===== $t" '$0 == t {p = 1} p' $D/gpu-tests.log | grep -v '^frame #' | tail -25
    fi
  done
  return $rc
}
stage gpu-tests 400 bash -c "$(declare -f gpu_tests); B=$B D=$D gpu_tests"
tests_line="$(grep -c '^\[gpu-test\] passed' "$log") passed, $(grep -c '^\[gpu-test\] FAILED' "$log") failed"
# Fine-tuning throughput against PyTorch eager on the same models and data.
stage train-throughput 300 "$py" bench/train_cuda.py --lopper $B/lopper --data-dir $fmnist_dir \
  --epochs 2 --json $D/gpu-train.json

# The GPU kernel benchmarks: lopper's sparse kernel against cuBLAS (8192x8192 bf16, batch 1-16,
# 90% and 95% zero) and 2:4 on the sparse tensor cores against cuBLAS (batch 2048-8192).
stage kernel-bench 300 bash -c "$B/bench/lopper_kernel_bench --benchmark_filter='${GPU_BENCH_FILTER:-Cuda}' \
  --benchmark_format=json --benchmark_min_time=$([ $quick = 1 ] && echo 0.05 || echo 0.2) \
  > $D/gpu-bench.json"
# Structured: resnet50 with channels removed until half its MACs are gone, batch 64, dense vs
# pruned in lopper (PyTorch eager as the dense peer).
stage structured 400 "$py" bench/structured_cuda.py --lopper $B/lopper --model resnet50 \
  --batch 64 --iters $([ $quick = 1 ] && echo 5 || echo 20) --json $D/gpu-structured.json \
  --profile-dir $D/structured-profile

f=$B/fixtures o=$B/cli
mkdir -p $o
cli_ok=0 cli_n=0
cli() {
  cli_n=$((cli_n + 1))
  echo "+ lopper $*" >> "$log"
  if timeout 240 $B/lopper "$@" >> "$log" 2>&1; then cli_ok=$((cli_ok + 1));
  else status=1; failed+=("lopper $*"); echo "[gpu-check] FAILED: lopper $*" | tee -a "$log"; fi
}
if selected cli; then
  t0=$(date +%s)
  echo "[gpu-check] cli ($(( t0 - t_start )) s in)" | tee -a "$log"
  cli run $f/resnet18.ts.onnx -i input=$f/resnet18.input_0.npy -o $o/run --device cuda
  cli bench $f/resnet18.ts.onnx --device cuda --iters 20 --precision fp16
  cli bench $f/mlp.ts.onnx --device cuda --iters 5 --explain
  cli compare $f/mlp.ts.onnx $f/mlp.ts.onnx --device cuda --iters 5
  cli eval examples/lenet5.onnx --data $fmnist --device cuda --precision bf16
  cli prune $f/mlp.ts.onnx -o $o/mlp-taylor.onnx --method taylor --amount 0.5 --data $fmnist \
    --calib-batches 4 --device cuda
  cli prune examples/lenet300_100.onnx -o $o/l300-wanda.onnx --method wanda --amount 0.5 \
    --data $fmnist --device cuda
  cli prune examples/lenet300_100.onnx -o $o/l300-sparsegpt.onnx --method sparsegpt \
    --pattern 2:4 --data $fmnist --device cuda
  cli prune $f/bert.ts.onnx -o $o/bert-24.onnx --method l1 --pattern 2:4
  cli bench $o/bert-24.onnx --device cuda --precision bf16 --iters 5 --explain
  cli prune $f/bert.ts.onnx -o $o/bert-90.onnx --method l1 --amount 0.9
  cli bench $o/bert-90.onnx --device cuda --precision bf16 --iters 5 --explain
  cli sensitivity examples/lenet5.onnx --data $fmnist --device cuda --amounts 0.5,0.9 \
    -o $o/lenet5.sens.json
  echo "[gpu-check] cli: $cli_ok of $cli_n ran in $(( $(date +%s) - t0 )) s" | tee -a "$log"
fi
if selected cli-train; then
  t0=$(date +%s)
  echo "[gpu-check] cli-train ($(( t0 - t_start )) s in)" | tee -a "$log"
  cli train $f/small_cnn.preserve.onnx -o $o/cnn-fp16.onnx --data $fmnist --epochs 1 \
    --device cuda --precision fp16
  cli train $f/small_cnn.preserve.onnx -o $o/cnn-bf16.onnx --data $fmnist --epochs 1 \
    --device cuda --precision bf16 --schedule agp --prune-method l1 --prune-amount 0.5 \
    --end-epoch 1 --prune-pattern 2:4
  cli finetune examples/resnet_fmnist.onnx -o $o/resnet-ft.onnx --data $fmnist --device cuda \
    --schedule iterative --rounds 1 --epochs-per-round 1 --prune-structured channel \
    --prune-method l1 --prune-amount 0.3
  echo "[gpu-check] cli-train: $cli_ok of $cli_n ran in $(( $(date +%s) - t0 )) s" | tee -a "$log"
fi

# Data parallel on NCCL with one GPU: two ranks on it (NCCL may refuse a GPU twice in one
# communicator: what lopper says then is the check), each rank's log kept.
nccl_try() {
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 timeout 100 $B/lopper train \
      examples/lenet5.onnx -o $o/dp$r.onnx --data $fmnist --epochs 1 --device cuda \
      --dist-timeout 60 --no-eval > $B/nccl-rank$r.log 2>&1 &
  done
  wait
  tail -n 8 $B/nccl-rank0.log $B/nccl-rank1.log
}
stage nccl 150 bash -c "$(declare -f nccl_try); B=$B o=$o fmnist=$fmnist nccl_try"

if [ $python_module = ON ]; then
  stage python 300 env PYTHONPATH=$B/python LOPPER_FIXTURES_DIR=$B/fixtures "$py" -m pytest -q python/tests/test_prune.py \
    python/tests/test_session.py -k "cuda or gpu" -p no:cacheprovider
fi

"$py" - $D/gpu-bench.json $D/gpu-structured.json $D/gpu-train.json "$tests_line" \
  "$cli_ok/$cli_n" <<'PY' | tee $D/gpu-check.md
import json, os, sys
import torch
load = lambda p, empty: json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else empty
t = {}
for b in load(sys.argv[1], {}).get("benchmarks", []):
    if b.get("error_occurred"):
        print(f"benchmark {b['name']}: {b.get('error_message', 'failed')}")
        continue
    name = b["name"].split("/")
    args = dict(p.split(":") for p in name[1:] if ":" in p)
    t[(name[0], int(args.get("batch", 0)), int(args.get("sparsity", 0)))] = b["real_time"]
print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"GPU tests: {sys.argv[4]}; CLI --device cuda: {sys.argv[5]} ran")


def table(title, dense_key, cols, target):
    print(f"\n{title}\n")
    print("| shape | batch | sparsity | cuBLAS µs | " + " | ".join(f"{c} µs | speedup" for c in cols.values()) + " |")
    print("|---|---|---|---|" + "---|---|" * len(cols))
    for (k, batch, sp), dense in sorted(t.items()):
        if k != dense_key:
            continue
        cells = []
        for key in cols:
            us = t.get((key, batch, sp))
            cells += [f"{us:.1f}", f"{dense / us:.2f}x"] if us else ["–", "–"]
        print(f"| 8192x8192 bf16 | {batch} | {sp}% | {dense:.1f} | " + " | ".join(cells) + " |")
    print(f"\ntarget: {target}")


table("Unstructured sparse, skinny batch (lopper's own kernel)", "CudaCublas",
      {"CudaCsr16": "lopper cuda-csr16"}, ">= 2.5x over cuBLAS at 90%, batch 1")
table("2:4 on the sparse tensor cores (ATen's semi-structured ops)", "Cuda24Cublas",
      {"Cuda24Cusparselt": "cuSPARSELt", "Cuda24Cutlass": "CUTLASS"},
      ">= 1.15x over cuBLAS at batch >= 2048")
rows = load(sys.argv[2], {}).get("rows", [])
print("\nStructured (channels removed), lopper --device cuda\n")
print("| model | batch | precision | MACs kept | dense ms | pruned ms | speedup | PyTorch eager dense ms |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['macs_kept']:.3f} | {r['dense_ms']:.2f} | "
          f"{r['pruned_ms']:.2f} | {r['speedup']:.2f}x | {r['torch_dense_ms']:.2f} |")
print("\ntarget: >= 1.6x over the dense model at 50% MACs, batch 64")
rows = load(sys.argv[3], {}).get("rows", [])
print("\nTraining throughput (Fashion-MNIST, batch 128, SGD), samples/s\n")
print("| model | precision | lopper | PyTorch eager | lopper / PyTorch |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r['model']} | {r['precision']} | {r['lopper_sps']:.0f} | {r['torch_sps']:.0f} | {r['ratio']:.2f}x |")
PY
echo "[gpu-check] done in $(( $(date +%s) - t_start )) s; failed: ${failed[*]:-none}; skipped: ${skipped[*]:-none}" | tee -a "$log"
exit $status
