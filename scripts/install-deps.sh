#!/usr/bin/env bash
# The one list of lopper's dependencies. Idempotent: installs only what is missing.
#   Debian packages (apt-get, as root) and the project venv (.venv) from scripts/requirements.txt.
#   --run: only what building lopper and its main job need (`make run`); without it, the tests'
#   peers and tools too (`make test`, `make build`).
set -euo pipefail
cd "$(dirname "$0")/.."
only_run=0
case "${1:-}" in
  --run) only_run=1 ;;
  "") ;;
  *) echo "install-deps.sh: unknown argument '$1' (usage: install-deps.sh [--run])" >&2; exit 2 ;;
esac

debs=(
  cmake ninja-build ccache g++ pkg-config
  libprotobuf-dev protobuf-compiler     # ONNX's protobuf classes (protoc on the onnx package's onnx.proto)
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev
  libre2-dev                            # linear-time regexes for patterns on untrusted names
  libgtest-dev libgmock-dev libbenchmark-dev   # small; CMake configures the tests' targets
  dataset-fashion-mnist                 # real data: gzipped IDX files in /usr/share/datasets/fashion-mnist
  libpng-dev                            # PNG images of folder: datasets
  libjpeg62-turbo-dev                   # JPEG images of folder: datasets
  zlib1g-dev                            # gzipped IDX files
  libgloo-dev                           # gloo headers for the wheel's ProcessGroupGloo.hpp (never linked)
  libjs-chart.js                        # Chart.js, inlined into HTML reports (--report)
  python3-venv
)
if ((!only_run)); then
  debs+=(
    clang libclang-rt-14-dev            # libFuzzer target for the importer
    clang-format                        # the code's one format (.clang-format), checked by .ci/run
    libonnx-testdata                    # ONNX's conformance cases (pytorch-converted, pytorch-operator)
    chromium                            # headless: the test that renders a report
  )
fi

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[install-deps] apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The venv: re-installed only when the requirements file changes.
req=scripts/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install-deps] creating .venv from $req (torch is several GB the first time)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install --progress-bar off -q -r "$req"
  echo "$want" > "$stamp"
fi
((only_run)) || scripts/install-llmcompressor.sh   # llm-compressor in .venv-llmc: the peer of tests/python/check_llm_parity.py
