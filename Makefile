# lopper: two commands. `make run` (set-up, build, the main job) and `make test` (set-up, build, ctest).
BUILD ?= build
JOBS ?= $(shell nproc)
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
MODEL ?= examples/cnn_small.onnx

.PHONY: deps configure build run test bench fuzz clean

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt scripts/requirements.txt
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOPPER_PYTHON=$(PY)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/lopper inspect $(MODEL)
	$(BUILD)/lopper bench $(MODEL) --batch 1 --iters 50

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1500 -j 1

bench: build
	$(PY) bench/compare_runtimes.py --lopper $(BUILD)/lopper

clean:
	rm -rf $(BUILD)
