# The two README commands (`make demo`, `make test`) and their building blocks.
# Each target installs what is missing first and is safe to run again.
PRESET ?= default
BUILD_DIR := build
JOBS ?= $(shell nproc)

.PHONY: all deps bench-deps configure build test test-tsan test-asan fuzz format format-check demo demo-cluster demo-model install uninstall clean

# The concurrency tests that also run under ThreadSanitizer (engine and emulator; Debian's
# gRPC and abseil are not TSan-instrumented, so the gRPC edge stays out).
TSAN_TESTS := engine_test\.(EngineStressTest|StressTest|KvStoreStateConcurrencyTest|NpuAttentionDeviceTest|GpuDeviceTest|EngineTest)|kernels_npu_test\.(DeviceTest|LaunchSequenceTest|Programs/ProgramOrderTest|(Fp8)?Batches/StepsOnDevicesTest.*(NpuTwoThreads|NpuFp8CubeTwoThreads))

all: build

deps:
	@scripts/install_deps.sh

# What the benchmarks need: since the FlashMLA tests run on torch, the same as `deps`.
bench-deps: deps
	@scripts/install_deps.sh --bench

configure: deps
	@test -f $(BUILD_DIR)/build.ninja || cmake --preset $(PRESET)

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

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
FUZZ_TEST_SECONDS ?= 10
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
install: deps
	@deploy/install.sh

uninstall:
	@deploy/uninstall.sh

clean:
	rm -rf $(BUILD_DIR) build-tsan build-asan
