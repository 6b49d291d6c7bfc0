# The CUDA device (docs/gpu.md) is built only where CMake finds a CUDA compiler and
# MLASERVE_CUDA allows it: AUTO (the default outside the presets), ON (a missing compiler is
# an error), OFF. The presets that CI and `make test` use say OFF: the CPU suite never builds
# device code, even where a CUDA toolkit happens to be installed; the `gpu` preset (`make
# build-gpu`) says ON.
#
# What it supports, stated here and checked below (README, "On a GPU machine"):
#   CUDA toolkit 12.5 or later: the attention kernels reach the driver's tensor-map encoder
#     through cudaGetDriverEntryPointByVersion, which the runtime has from 12.5 on. Built and
#     run with 13.0 (driver 580) on an H100 and an H200.
#   GPU architectures sm_80 or later: the kernels' mma.sync and cp.async paths. The default,
#     90a, is Hopper with its architecture-specific instructions (wgmma, the bulk tensor copy:
#     H100, H200); other GPUs name theirs with -DCMAKE_CUDA_ARCHITECTURES (80 for an A100).
set(MLASERVE_CUDA_MIN_VERSION 12.5)
set(MLASERVE_CUDA_MIN_ARCH 80)
set(MLASERVE_CUDA AUTO CACHE STRING "Build the CUDA device: AUTO, ON or OFF")
set_property(CACHE MLASERVE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(MLASERVE_HAVE_CUDA OFF)
if(NOT MLASERVE_CUDA STREQUAL "OFF")
  # NVIDIA's packages install the toolkit in /usr/local/cuda without putting it on PATH.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS
     /usr/local/cuda/bin/nvcc)
    find_program(MLASERVE_NVCC nvcc)
    if(NOT MLASERVE_NVCC)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Before enable_language: an older nvcc fails its test compile for sm_90a with a message
    # that does not say the toolkit is too old (Debian 12's own nvidia-cuda-toolkit is 11.8).
    execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --version OUTPUT_VARIABLE nvcc_version
                    ERROR_QUIET)
    string(REGEX MATCH "release ([0-9]+\\.[0-9]+)" found "${nvcc_version}")
    if(NOT found OR CMAKE_MATCH_1 VERSION_LESS MLASERVE_CUDA_MIN_VERSION)
      if(found)
        set(found "CUDA ${CMAKE_MATCH_1}")
      else()
        set(found "of no CUDA version it states")
      endif()
      message(FATAL_ERROR
        "${CMAKE_CUDA_COMPILER} is ${found}; mlaserve's CUDA kernels need CUDA "
        "${MLASERVE_CUDA_MIN_VERSION} or later. Install NVIDIA's CUDA toolkit "
        "(${MLASERVE_CUDA_MIN_VERSION} or later, with a driver that supports it) and point "
        "CMake at its nvcc (-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc), or build without "
        "CUDA (make build)")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a)
    endif()
    foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX MATCH "^[0-9]+" number "${arch}")
      if(arch STREQUAL "native")
        continue()
      elseif(NOT number OR number LESS MLASERVE_CUDA_MIN_ARCH)
        message(FATAL_ERROR
          "CMAKE_CUDA_ARCHITECTURES has '${arch}': mlaserve's CUDA kernels need sm_"
          "${MLASERVE_CUDA_MIN_ARCH} or later (mma.sync on bf16, cp.async). Name your GPU's "
          "architecture, e.g. -DCMAKE_CUDA_ARCHITECTURES=80 for an A100, 90a for an H100 or "
          "H200 (the default), or native")
      endif()
    endforeach()
    enable_language(CUDA)
    # CMake 3.25 predates nvcc 13 and does not know its C++20 flag: say it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    find_package(CUDAToolkit REQUIRED)
    set(MLASERVE_HAVE_CUDA ON)
  elseif(MLASERVE_CUDA STREQUAL "ON")
    message(FATAL_ERROR
      "MLASERVE_CUDA=ON (the gpu preset, make build-gpu), but CMake found no CUDA compiler "
      "(nvcc). Install NVIDIA's CUDA toolkit ${MLASERVE_CUDA_MIN_VERSION} or later; where its "
      "nvcc is neither on PATH nor /usr/local/cuda/bin/nvcc, name it with "
      "-DCMAKE_CUDA_COMPILER=PATH (README, \"On a GPU machine\")")
  endif()
endif()
# deploy/install.sh reads it: only a build with CUDA installs the mlaserve-gpu@ unit.
set(MLASERVE_HAVE_CUDA ${MLASERVE_HAVE_CUDA} CACHE INTERNAL "Whether this tree builds the CUDA device")
if(MLASERVE_HAVE_CUDA)
  message(STATUS "mlaserve: CUDA device ON (MLASERVE_CUDA=${MLASERVE_CUDA}, CUDA "
                 "${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "mlaserve: CUDA device OFF (MLASERVE_CUDA=${MLASERVE_CUDA})")
endif()
