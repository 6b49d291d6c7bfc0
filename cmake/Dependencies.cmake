# Every dependency comes from Debian 12 packages (scripts/install_deps.sh); see
# docs/dependencies.md for why each one is here.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)

# Debian's generic libblas is the unoptimised reference BLAS; insist on OpenBLAS.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(OPENBLAS_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread REQUIRED)
add_library(mlaserve_openblas INTERFACE)
target_link_libraries(mlaserve_openblas INTERFACE ${BLAS_LIBRARIES})
target_include_directories(mlaserve_openblas SYSTEM INTERFACE ${OPENBLAS_CBLAS_INCLUDE_DIR})
find_package(nlohmann_json CONFIG REQUIRED)
