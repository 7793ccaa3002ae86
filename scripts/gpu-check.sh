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
for cmd in "bench build-gpu/fixtures/resnet18.ts.onnx --device cuda --iters 5 --warmup 2" \
           "bench build-gpu/fixtures/mlp.ts.onnx --device cuda --iters 5 --explain" \
           "compare build-gpu/fixtures/mlp.ts.onnx build-gpu/fixtures/mlp.ts.onnx --device cuda --iters 5" \
           "eval build-gpu/fixtures/mlp.ts.onnx --data $fmnist --device cuda"; do
  cli_n=$((cli_n + 1))
  if build-gpu/lopper $cmd >> "$log" 2>&1; then cli_ok=$((cli_ok + 1)); else status=1; echo "FAILED: lopper $cmd" | tee -a "$log"; fi
done

# The GPU benchmarks: lopper's sparse kernel against cuBLAS (8192x8192 bf16, batch 1-16, 90%).
bench_json=build-gpu/gpu-bench.json
build-gpu/bench/lopper_kernel_bench --benchmark_filter='Cuda' --benchmark_format=json \
  --benchmark_min_time=$([ $quick = 1 ] && echo 0.05 || echo 0.3) > "$bench_json" 2>> "$log" || status=1

"$py" - "$bench_json" "$tests_line" "$cli_ok/$cli_n" <<'PY' | tee build-gpu/gpu-check.md
import json, sys
import torch
data = json.load(open(sys.argv[1])) if sys.argv[1] else {"benchmarks": []}
t = {}
for b in data.get("benchmarks", []):
    name = b["name"].split("/")
    args = dict(p.split(":") for p in name[1:] if ":" in p)
    t[(name[0], int(args.get("batch", 0)), int(args.get("sparsity", 0)))] = b["real_time"]
print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
print(f"GPU tests: {sys.argv[2]}; CLI --device cuda: {sys.argv[3]} ran")
print()
print("| shape | batch | sparsity | cuBLAS µs | lopper cuda-csr16 µs | speedup |")
print("|---|---|---|---|---|---|")
for (k, batch, sp), us in sorted(t.items()):
    if k != "CudaCsr16":
        continue
    dense = t.get(("CudaCublas", batch, sp))
    print(f"| 8192x8192 bf16 | {batch} | {sp}% | {dense:.1f} | {us:.1f} | {dense / us:.2f}x |" if dense else
          f"| 8192x8192 bf16 | {batch} | {sp}% | – | {us:.1f} | – |")
PY
exit $status
