# Every dependency comes from Debian 12 packages (scripts/install_deps.sh); see
# docs/dependencies.md for why each one is here.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)

# OpenBLAS, and specifically Debian's pthread build, used one thread per call: mlaserve runs
# many small matrix-unit calls concurrently from its own threads. Debian's serial build is
# not re-entrant (its packing buffers are shared without locks: concurrent calls corrupt
# each other), and in-call threading would change the summation order. Debian's generic
# libblas is the unoptimised reference BLAS and is never used.
find_library(OPENBLAS_LIBRARY openblas
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread NO_DEFAULT_PATH REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread NO_DEFAULT_PATH REQUIRED)
add_library(mlaserve_openblas INTERFACE)
target_link_libraries(mlaserve_openblas INTERFACE ${OPENBLAS_LIBRARY})
target_include_directories(mlaserve_openblas SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIR})
find_package(nlohmann_json CONFIG REQUIRED)
# SLEEF: vectorised exp for the softmax, which would otherwise be the host's largest cost
# after the matrix unit (scalar libm expf, one call per score).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SLEEF REQUIRED IMPORTED_TARGET sleef)
# oneDNN: the matrix unit's 128 x 128 tiles as bf16 matmuls on the CPU's matrix engine (AMX)
# where there is one. Found directly: Debian's CMake config also demands OpenCL headers for
# its GPU runtime, which mlaserve does not use. OpenMP only to run oneDNN one thread per call.
find_library(DNNL_LIBRARY dnnl REQUIRED)
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
add_library(mlaserve_dnnl INTERFACE)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  # clang's OpenMP runtime is libomp, Debian's oneDNN is built against GCC's libgomp, and a
  # process must hold only one: omp.h from clang (libomp-14-dev), the library from GCC.
  # mlaserve calls only omp_set_num_threads, which both provide; it has no OpenMP pragmas.
  target_compile_options(mlaserve_dnnl INTERFACE -fopenmp)
  target_link_libraries(mlaserve_dnnl INTERFACE ${DNNL_LIBRARY} gomp)
else()
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  target_link_libraries(mlaserve_dnnl INTERFACE ${DNNL_LIBRARY} OpenMP::OpenMP_CXX)
endif()
target_include_directories(mlaserve_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})

# The gRPC edge (server/service, client/). Protobuf 3.21 ships no CMake config: CMake's own
# FindProtobuf module. gRPC's config import-checks every protoc plugin, so it needs
# protobuf-compiler-grpc installed. libsystemd only for sd_notify.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
# The TLS files are checked at start with OpenSSL, the library gRPC itself uses on Debian.
find_package(OpenSSL REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
# /metrics over HTTP or HTTPS (server) and its scraper (loadgen): cpp-httplib on OpenSSL.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# The cross-host data plane (server/dataplane/ucx_*, client/dataplane/ucx_channel.*): UCX's
# ucp (active messages, the sockaddr listener) over uct's transports and ucs's utilities.
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
find_program(GRPC_PYTHON_PLUGIN grpc_python_plugin REQUIRED)
# Debian's python3-grpcio and python3-protobuf live in the system interpreter only (a
# pyenv or venv python3 earlier on PATH lacks them), so the Python client and its tests use
# it explicitly.
set(MLASERVE_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with python3-grpcio, -protobuf, -numpy")
