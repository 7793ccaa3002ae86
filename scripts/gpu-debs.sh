#!/usr/bin/env bash
# Run HERE (Debian 12, with apt): downloads the Debian packages lopper builds against into
# .gpu-debs/ (git-ignored), for a GPU machine that reaches no package registry. Pass that folder
# along (the device tool's `carry: [".gpu-debs"]`); scripts/gpu-check.sh unpacks it there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libyaml-cpp0.7
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo zlib1g-dev
  libgloo-dev dataset-fashion-mnist libjs-chart.js
)
mkdir -p .gpu-debs
cd .gpu-debs
rm -f ./*.deb
apt-get download "${pkgs[@]}"
du -sh .
