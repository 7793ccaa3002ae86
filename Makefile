# lopper: two commands. `make run` (set-up, build, the main job) and `make test` (set-up, build, ctest).
BUILD ?= build
JOBS ?= $(shell nproc)
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
MODEL ?= examples/cnn_small.onnx

.PHONY: deps deps-run configure build build-cli run test test-quick bench fuzz clean format format-check

# deps: everything (the tests' peers and tools too); deps-run: what lopper and its main job need.
deps:
	@scripts/install-deps.sh

deps-run:
	@scripts/install-deps.sh --run

$(BUILD)/build.ninja: CMakeLists.txt scripts/requirements.txt
	@scripts/install-deps.sh --run
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOPPER_PYTHON=$(PY)

configure: deps-run $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

# The CLI alone: what `make run` needs (not the Python package, the tests or the benchmarks).
build-cli: configure
	cmake --build $(BUILD) -j $(JOBS) --target lopper

# The main job: train LeNet-5 on Fashion-MNIST, prune it 90% on the AGP schedule while
# fine-tuning, and show the gain (params, nonzero, MACs, file size, test accuracy, latency).
OUT ?= out
run: build-cli
	@mkdir -p $(OUT)
	$(BUILD)/lopper train examples/lenet5.onnx --data fashion-mnist -o $(OUT)/lenet5.dense.onnx \
	  --epochs 3 --lr 0.02 --lr-schedule cosine --batch-size 128 --seed 0
	$(BUILD)/lopper train $(OUT)/lenet5.dense.onnx --data fashion-mnist -o $(OUT)/lenet5.pruned.onnx \
	  --epochs 5 --lr 0.01 --lr-schedule cosine --batch-size 128 --seed 1 \
	  --schedule agp --prune-method l1 --prune-amount 0.9 --start-epoch 0 --end-epoch 3 \
	  --sparse-initializers --report $(OUT)/lenet5.pruned.report.html
	$(BUILD)/lopper compare $(OUT)/lenet5.dense.onnx $(OUT)/lenet5.pruned.onnx --data fashion-mnist \
	  --threads 1 -o $(OUT)/lenet5.pruned.compare.json --report $(OUT)/lenet5.compare.html

# -j 2: the tests are mostly one Python process driving lopper at a time; two at once keep both
# cores busy (no test asserts a timing). data_parallel_two_ranks runs alone (tests/CMakeLists.txt).
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1500 -j 2 -LE quick_only

# The quick tier: unit tests, one parity and one structured case, robustness (ctest -L quick:
# the labels quick and quick_only); CI runs the full `make test`.
test-quick: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j 2 -L quick

bench: build
	$(PY) bench/compare_runtimes.py --lopper $(BUILD)/lopper

# The code's one format (.clang-format): `make format` applies it, `make format-check` (run by
# .ci/run) fails on any file that differs.
FORMATTED = $(shell git ls-files 'src/*.cpp' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'include/*.h' \
                      'tests/*.cpp' 'tests/*.h' 'bench/*.cpp' 'bench/*.h' 'examples/*.cpp' \
                      'python/*.cpp' 'python/*.h')
format: deps
	@clang-format -i $(FORMATTED) && echo "clang-format: $(words $(FORMATTED)) files formatted"

format-check: deps
	@clang-format --dry-run -Werror $(FORMATTED) && echo "clang-format: $(words $(FORMATTED)) files clean"

clean:
	rm -rf $(BUILD)
