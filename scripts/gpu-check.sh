#!/usr/bin/env bash
# On a GPU machine: builds lopper against that machine's PyTorch with CUDA, runs the GPU tests and
# the GPU benchmarks, and prints one table (also written to build-gpu/gpu-check.md).
#
#   here:       scripts/gpu-debs.sh                    # once: the Debian packages to carry
#   GPU machine: scripts/gpu-check.sh [--quick]        # with .gpu-debs carried along
#
# The GPU machine has python3 with torch, onnx, torchvision, CMake, ninja and nvcc, but no Debian
# -dev packages and no network: they come unpacked from .gpu-debs into a private prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

py=${LOPPER_PYTHON:-$(command -v python3)}
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'" ||
  { echo "gpu-check: needs a CUDA GPU and a python3 with torch"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

prefix=/tmp/lopper-gpu-prefix
cmake_extra=()
if [ -d .gpu-debs ] && ! [ -f /usr/include/google/protobuf/message.h ]; then
  echo "[gpu-check] unpacking $(ls .gpu-debs/*.deb | wc -l) Debian packages into $prefix"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in .gpu-debs/*.deb; do dpkg-deb -x "$f" "$prefix"; done
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$prefix/usr/bin:$PATH"
  cmake_extra+=(-DCMAKE_PREFIX_PATH="$prefix/usr"
                -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc"
                -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include")
fi

start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOPPER_PYTHON="$py" \
  -DTORCH_CUDA_ARCH_LIST="9.0" "${cmake_extra[@]}"
cmake --build build-gpu -j "$(nproc)"
echo "[gpu-check] built in $(( $(date +%s) - start )) s"

log=build-gpu/gpu-check.log
: > "$log"
status=0
# Fixtures, then every test that needs a GPU (they skip elsewhere) and the CLI on --device cuda.
"$py" tests/fixtures/make_models.py build-gpu/fixtures >> "$log" 2>&1 || status=1
LOPPER_FIXTURES_DIR=build-gpu/fixtures build-gpu/tests/lopper_tests \
  --gtest_filter='*Cuda*:*Gpu*:*Device*' 2>&1 | tee -a "$log" | tail -5 || status=1
tests_line=$(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' ')
fmnist=fashion-mnist
[ -d /usr/share/datasets/fashion-mnist ] || fmnist="idx:$prefix/usr/share/datasets/fashion-mnist"
cli_ok=0; cli_n=0
f=build-gpu/fixtures o=build-gpu/cli
mkdir -p $o
for cmd in "bench $f/resnet18.ts.onnx --device cuda --iters 5 --warmup 2" \
           "bench $f/mlp.ts.onnx --device cuda --iters 5 --explain" \
           "compare $f/mlp.ts.onnx $f/mlp.ts.onnx --device cuda --iters 5" \
           "eval $f/mlp.ts.onnx --data $fmnist --device cuda" \
           "eval $f/mlp.ts.onnx --data $fmnist --device cuda --precision fp16" \
           "prune $f/mlp.ts.onnx -o $o/mlp-taylor.onnx --method taylor --amount 0.5 --data $fmnist --calib-batches 4 --device cuda" \
           "prune $f/bert.ts.onnx -o $o/bert-24.onnx --method l1 --amount 0.5 --pattern 2:4" \
           "bench $o/bert-24.onnx --device cuda --precision bf16 --iters 5 --explain" \
           "train $f/small_cnn.preserve.onnx -o $o/cnn-fp16.onnx --data $fmnist --epochs 1 --device cuda --precision fp16" \
           "train $f/small_cnn.preserve.onnx -o $o/cnn-bf16.onnx --data $fmnist --epochs 1 --device cuda --precision bf16 --schedule agp --prune-method l1 --prune-amount 0.5 --end-epoch 1 --prune-pattern 2:4"; do
  cli_n=$((cli_n + 1))
  if build-gpu/lopper $cmd >> "$log" 2>&1; then cli_ok=$((cli_ok + 1)); else status=1; echo "FAILED: lopper $cmd" | tee -a "$log"; fi
done

# The GPU kernel benchmarks: lopper's sparse kernel against cuBLAS (8192x8192 bf16, batch 1-16,
# 90% and 95% zero) and 2:4 on the sparse tensor cores against cuBLAS (batch 2048-8192).
bench_json=build-gpu/gpu-bench.json
build-gpu/bench/lopper_kernel_bench --benchmark_filter='Cuda' --benchmark_format=json \
  --benchmark_min_time=$([ $quick = 1 ] && echo 0.05 || echo 0.3) > "$bench_json" 2>> "$log" || status=1

# Structured: resnet50 with channels removed until half its MACs are gone, batch 64, dense vs
# pruned in lopper (PyTorch eager as the dense peer).
structured_json=build-gpu/gpu-structured.json
"$py" bench/structured_cuda.py --lopper build-gpu/lopper --model resnet50 --batch 64 \
  --iters $([ $quick = 1 ] && echo 5 || echo 30) --json "$structured_json" >> "$log" 2>&1 ||
  { status=1; echo "FAILED: bench/structured_cuda.py" | tee -a "$log"; }

"$py" - "$bench_json" "$structured_json" "$tests_line" "$cli_ok/$cli_n" <<'PY' | tee build-gpu/gpu-check.md
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
print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
print(f"GPU tests: {sys.argv[3]}; CLI --device cuda: {sys.argv[4]} ran")


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
PY
exit $status
