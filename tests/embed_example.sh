#!/usr/bin/env bash
# lopper as a library another CMake project uses: installs this build into a prefix, builds
# examples/embed/ against it (find_package(lopper), lopper::lopper), and runs the program on
# examples/cnn_small.onnx. It must exit 0 and print the MACs of the pruned model: fewer than the
# model's, and the same count the installed CLI reports for `lopper prune --structured channel
# --amount 0.5`.
#
#   embed_example.sh BUILD_DIR SOURCE_DIR PYTHON [COMPILER_LAUNCHER]
#
# COMPILER_LAUNCHER: the main build's CMAKE_CXX_COMPILER_LAUNCHER (ccache's, its list items joined
# by '|'), reused so that the example's one compile against libtorch's headers is cached.
set -uo pipefail

build=$(realpath "$1")
src=$(realpath "$2")
python=$3
launcher=${4:-}
launcher=${launcher//|/;}
work="$build/embed-example"
prefix="$work/prefix"
model="$src/examples/cnn_small.onnx"

fail() {
  echo "embed_example: $*" >&2
  exit 1
}
# Runs a step quietly; on failure prints its log and fails naming the step.
step() {
  local what=$1 log="$work/$2.log"
  shift 2
  if ! "$@" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    fail "$what failed (full log: $log)"
  fi
}

mkdir -p "$work" || fail "cannot create $work"

# 1. Install into a fresh prefix, so that nothing left from an earlier install hides a missing file.
rm -rf "$prefix"
step "cmake --install $build --prefix $prefix" install cmake --install "$build" --prefix "$prefix"
# (lib/cmake/lopper, or lib/<multiarch>/cmake/lopper when the build was configured for /usr)
config=$(find "$prefix" -path '*/cmake/lopper/lopperConfig.cmake' -print -quit)
[[ -n "$config" ]] || fail "the install wrote no lib/cmake/lopper/lopperConfig.cmake under $prefix"
[[ -f "$prefix/include/lopper/lopper.h" ]] || fail "the install wrote no include/lopper/lopper.h"
[[ -x "$prefix/bin/lopper" ]] || fail "the install wrote no bin/lopper"

# 2. Configure the consumer project against the prefix, with the venv's torch.
torch_prefix=$("$python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)") ||
  fail "$python cannot import torch"
args=(-S "$src/examples/embed" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
      "-Dlopper_DIR=$(dirname "$config")" "-DCMAKE_PREFIX_PATH=$torch_prefix")
[[ -n "$launcher" ]] && args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
step "configuring examples/embed against $prefix" configure cmake "${args[@]}"

# 3. Build it.
step "building examples/embed" build cmake --build "$work/build"

# 4. Run it (from the source folder, where its default model path points).
out=$(cd "$src" && "$work/build/embed" "$model" 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || fail "embed exited with $rc"

# 5. Its MACs: fewer after than before, and what the installed CLI finds for the same pruning.
read -r before after < <(sed -n 's/^MACs: *\([0-9]*\) -> \([0-9]*\)$/\1 \2/p' <<<"$out")
[[ -n "${after:-}" ]] || fail "embed printed no 'MACs: BEFORE -> AFTER' line"
((after < before)) || fail "embed's pruned model has $after MACs, not fewer than $before"

macs_of() {
  local json
  json=$("$prefix/bin/lopper" inspect "$1" --json) || return 1
  "$python" -c "import json, sys; print(json.loads(sys.argv[1])['macs'])" "$json"
}
cli_before=$(macs_of "$model") || fail "the installed lopper inspect failed on $model"
rm -f "$work/pruned.onnx"
step "the installed lopper prune --structured channel --amount 0.5" prune \
  "$prefix/bin/lopper" prune "$model" --structured channel --amount 0.5 -o "$work/pruned.onnx"
cli_after=$(macs_of "$work/pruned.onnx") ||
  fail "the installed lopper inspect failed on the pruned model"
[[ "$before" == "$cli_before" ]] ||
  fail "embed says $before MACs before pruning, lopper inspect $cli_before"
[[ "$after" == "$cli_after" ]] ||
  fail "embed says $after MACs after pruning, lopper prune + inspect $cli_after"
echo "embed_example: ok ($before -> $after MACs, as the CLI finds)"
