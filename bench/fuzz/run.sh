#!/usr/bin/env bash
# Short libFuzzer run of the ONNX importer (or the .npy reader).
#   bench/fuzz/run.sh [SECONDS] [TARGET]     SECONDS defaults to 60; TARGET fuzz_import | fuzz_npy
# Builds build-fuzz/ if needed (clang, ASan + libFuzzer), seeds the corpus once from ONNX's
# conformance models, runs one process (libFuzzer's default: one core; -jobs=1 would only move
# the output to fuzz-0.log), and prints libFuzzer's final stats. Crash, leak, OOM and
# timeout inputs land in build-fuzz/artifacts/<target>/. Exit status is libFuzzer's (0 = clean).
set -euo pipefail
SECONDS_TO_RUN=${1:-60}
TARGET=${2:-fuzz_import}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${LOPPER_FUZZ_BUILD:-$ROOT/build-fuzz}
PY=${LOPPER_PYTHON:-$ROOT/.venv/bin/python}

if [[ ! -f $B/build.ninja ]]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLOPPER_FUZZ=ON -DLOPPER_TESTS=OFF -DLOPPER_PYTHON="$PY" >/dev/null
fi
ninja -C "$B" -j2 "$TARGET" >/dev/null

CORPUS=$B/corpus/$TARGET
SEEDS=$B/seeds/$TARGET
if [[ ! -d $SEEDS ]]; then
  mkdir -p "$SEEDS.tmp"
  n=0
  if [[ $TARGET == fuzz_import ]]; then
    # Small conformance models only (max_len caps inputs anyway); names keep the case.
    for f in "$ROOT"/build/onnx-node-cases/*/model.onnx /usr/share/libonnx-testdata/data/*/*/model.onnx; do
      [[ -f $f ]] || continue
      [[ $(stat -c %s "$f") -le 65536 ]] || continue
      case=$(basename "$(dirname "$f")")
      [[ $f == /usr/share/* ]] && case=libonnx-$(basename "$(dirname "$(dirname "$f")")")-$case
      cp "$f" "$SEEDS.tmp/$case.onnx"; n=$((n + 1))
    done
  else
    # A few .npy files written by numpy itself (every dtype the reader knows, a few shapes).
    "$PY" - "$SEEDS.tmp" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
for i, t in enumerate(["<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "|u1", "|b1", "<u2", "<u4",
                       "<u8", "<c8", "<c16"]):
    for j, shape in enumerate([(), (0,), (3,), (2, 3), (1, 2, 1, 2)]):
        np.save(f"{d}/{i}_{j}.npy", np.arange(int(np.prod(shape))).astype(t).reshape(shape))
PYEOF
    n=$(ls "$SEEDS.tmp" | wc -l)
  fi
  mv "$SEEDS.tmp" "$SEEDS"
  echo "seeded $n inputs into $SEEDS"
fi
mkdir -p "$CORPUS" "$B/artifacts/$TARGET"

# ASan: allocation failures return null so that ATen answers with c10::Error, as it would without
# ASan; leaks are findings.
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1:abort_on_error=0}
set +e
REGRESSIONS=()
[[ -d $ROOT/bench/fuzz/regressions/$TARGET ]] && REGRESSIONS=("$ROOT/bench/fuzz/regressions/$TARGET")
"$B/$TARGET" "$CORPUS" "$SEEDS" "${REGRESSIONS[@]}" -max_len=65536 -rss_limit_mb=4096 -timeout=25 \
  -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 \
  -artifact_prefix="$B/artifacts/$TARGET/" 2>&1 | tee "$B/$TARGET.log" |
  grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|stat::|Done|==[0-9]+==|SUMMARY|artifact_prefix|Test unit written|.*ERROR)' 
rc=${PIPESTATUS[0]}
set -e
echo "full log: $B/$TARGET.log; exit status $rc"
exit "$rc"
