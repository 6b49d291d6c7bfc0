# The two README commands (`make demo`, `make test`) and their building blocks.
# Each target installs what is missing first and is safe to run again.
PRESET ?= default
BUILD_DIR := build
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo install uninstall clean

all: build

deps:
	@scripts/install_deps.sh

configure: deps
	@test -f $(BUILD_DIR)/build.ninja || cmake --preset $(PRESET)

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

demo: build
	@scripts/demo.sh

# The systemd service (docs/deploy.md). PREFIX and DESTDIR pass through the environment.
install: deps
	@deploy/install.sh

uninstall:
	@deploy/uninstall.sh

clean:
	rm -rf $(BUILD_DIR) build-tsan build-asan
