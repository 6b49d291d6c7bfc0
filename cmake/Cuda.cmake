# The CUDA device (docs/gpu.md) is built only where CMake finds a CUDA compiler and
# MLASERVE_CUDA allows it: AUTO (the default outside the presets), ON (a missing compiler is
# an error), OFF. The presets that CI and `make test` use say OFF: the CPU suite never builds
# device code, even where a CUDA toolkit happens to be installed; the `gpu` preset says ON.
set(MLASERVE_CUDA AUTO CACHE STRING "Build the CUDA device: AUTO, ON or OFF")
set_property(CACHE MLASERVE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(MLASERVE_HAVE_CUDA OFF)
if(NOT MLASERVE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90a: Hopper with its architecture-specific instructions; the kernels' mma.sync path
    # also runs on sm_80 and later (-DCMAKE_CUDA_ARCHITECTURES=80 for an A100).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a)
    endif()
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
    message(FATAL_ERROR "MLASERVE_CUDA=ON, but CMake found no CUDA compiler (nvcc)")
  endif()
endif()
message(STATUS "mlaserve: CUDA device ${MLASERVE_HAVE_CUDA} (MLASERVE_CUDA=${MLASERVE_CUDA})")
