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
