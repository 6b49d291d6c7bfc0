# The two README commands (`make demo`, `make test`) and their building blocks.
# Each target installs what is missing first and is safe to run again.
PRESET ?= default
BUILD_DIR := build
JOBS ?= $(shell nproc)

.PHONY: all deps bench-deps configure build build-gpu test test-gpu test-tsan test-asan fuzz format format-check demo demo-cluster demo-model install uninstall clean

# The concurrency tests that also run under ThreadSanitizer (engine and emulator; Debian's
# gRPC and abseil are not TSan-instrumented, so the gRPC edge stays out).
TSAN_TESTS := engine_test\.(EngineStressTest|StressTest|KvStoreStateConcurrencyTest|NpuAttentionDeviceTest|GpuDeviceTest|EngineTest)|kernels_npu_test\.(DeviceTest|HostExecutorTest|LaunchSequenceTest|Programs/ProgramOrderTest|(Fp8)?Batches/StepsOnDevicesTest.*(NpuTwoThreads|NpuFp8CubeTwoThreads))

all: build

# SKIP_DEPS=1 installs nothing: for a machine whose dependencies come some other way (built
# from source, an image, another package manager); CMake then finds them or says which is not.
deps:
ifeq ($(SKIP_DEPS),)
	@scripts/install_deps.sh
else
	@echo "deps: SKIP_DEPS=$(SKIP_DEPS): installing no packages"
endif

# What the benchmarks need: since the FlashMLA tests run on torch, the same as `deps`.
bench-deps: deps
	@scripts/install_deps.sh --bench

configure: deps
	@test -f $(BUILD_DIR)/build.ninja || cmake --preset $(PRESET)

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

# The CUDA build (README, "On a GPU machine"): the same packages as `build`, then the `gpu`
# preset (MLASERVE_CUDA=ON) into build-gpu/. NVIDIA's driver and CUDA toolkit are the
# machine's own; cmake/Cuda.cmake checks the version and the architectures. CMAKE_ARGS passes
# configure options (and configures again): CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=80.
build-gpu: deps
	@if [ ! -f build-gpu/build.ninja ] || [ -n "$(CMAKE_ARGS)" ]; then cmake --preset gpu $(CMAKE_ARGS); fi
	@cmake --build --preset gpu -j $(JOBS)

# The GPU tests on GPU 0, none allowed to skip: the suite labelled gpu (kernels against the
# golden, one process each), the server's golden tests on cuda:0, and the Python client with
# its FlashMLA drop-in against a server on the GPU (PYTHON: an interpreter with grpcio, numpy
# and torch). Four GPU tests at a time, as the runs of record (docs/testing.md) ran them.
PYTHON ?= /usr/bin/python3
test-gpu: build-gpu
	@cd build-gpu && MLASERVE_REQUIRE_GPU=1 ctest -L gpu -j 4 --timeout 300 --output-on-failure
	@MLASERVE_REQUIRE_GPU=1 MLASERVE_TEST_GPU=cuda:0 build-gpu/bin/integration_test --gtest_filter='*Gpu*'
	@PYTHONPATH=build-gpu/python $(PYTHON) tests/integration/python_smoke_test.py \
	  --server build-gpu/bin/mlaserve-server --devices=cuda:0 \
	  --example client/python/examples/decode_example.py

test: format-check build
	@ctest --preset $(PRESET) -j $(JOBS)
	@$(MAKE) --no-print-directory test-tsan
	@$(MAKE) --no-print-directory test-asan

test-tsan: deps
	@test -f build-tsan/build.ninja || cmake --preset tsan
	@cmake --build --preset tsan -j $(JOBS) --target engine_test kernels_npu_test
	@ctest --preset tsan -j $(JOBS) -R '$(TSAN_TESTS)'

# The whole default suite again under AddressSanitizer + UBSan (clang; every finding fails),
# then every fuzzer for FUZZ_TEST_SECONDS from its seed corpus.
FUZZ_TEST_SECONDS ?= 5
test-asan: deps
	@test -f build-asan/build.ninja || cmake --preset asan
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan -j $(JOBS)
	@scripts/fuzz.sh $(FUZZ_TEST_SECONDS)

# The libFuzzer harnesses (tests/fuzz/) for FUZZ_SECONDS each; HARNESS=name runs one.
FUZZ_SECONDS ?= 60
fuzz: deps
	@test -f build-asan/build.ninja || cmake --preset asan
	@cmake --build --preset asan -j $(JOBS) --target fuzzers
	@scripts/fuzz.sh $(FUZZ_SECONDS) $(HARNESS)

# The C++ sources follow .clang-format (Google style, 100 columns); `make format` applies it.
FORMATTED = $(shell git ls-files --cached --others --exclude-standard '*.cc' '*.h' 2>/dev/null || find . -path ./build\* -prune -o \( -name '*.cc' -o -name '*.h' \) -print)

format: deps
	@clang-format -i $(FORMATTED)

format-check: deps
	@clang-format --dry-run --Werror $(FORMATTED) || \
	  { echo "format-check: run 'make format' to apply .clang-format" >&2; exit 1; }

# `make demo KV_DTYPE=fp8` (or ARGS=--kv_dtype=fp8) holds the demo's KV cache in SnapMLA's FP8
# form; ARGS passes any other flag to scripts/demo.sh.
demo: build
	@scripts/demo.sh $(if $(KV_DTYPE),--kv-dtype=$(KV_DTYPE)) $(ARGS)

# make demo's workload on three servers and Debian's etcd, through the cluster client, with a
# drain under load (docs/cluster.md); ARGS passes flags to the first load run.
demo-cluster: build
	@scripts/cluster_demo.sh $(ARGS)

# A DeepSeek-V3-architecture model generating through the server, beside local attention
# (docs/model.md); ARGS passes flags to scripts/model_demo.py.
demo-model: build
	@PYTHONPATH=build/python /usr/bin/python3 scripts/model_demo.py $(ARGS)

# The systemd service (docs/deploy.md). PREFIX and DESTDIR pass through the environment.
# GPU=1 installs the CUDA build (build-gpu/, configured if need be) with mlaserve-gpu@N;
# without GPU, build-gpu/ when it was built with CUDA, else build/.
install: deps
	@GPU=$(GPU) deploy/install.sh

uninstall:
	@deploy/uninstall.sh

clean:
	rm -rf $(BUILD_DIR) build-tsan build-asan
