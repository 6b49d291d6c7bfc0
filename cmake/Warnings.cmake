# Project-wide compile settings, applied only to mlaserve's own targets (generated protobuf
# code and third-party headers are not held to them).
add_library(mlaserve_compile_options INTERFACE)
# C++ only: nvcc takes its own (kernels/CMakeLists.txt).
target_compile_options(mlaserve_compile_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Wimplicit-fallthrough>)
if(MLASERVE_WERROR)
  target_compile_options(mlaserve_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(MLASERVE_NATIVE)
  target_compile_options(mlaserve_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
if(MLASERVE_SANITIZE)
  # A sanitizer finding fails the run: nothing recovers and goes on.
  target_compile_options(mlaserve_compile_options INTERFACE
    -fsanitize=${MLASERVE_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(mlaserve_compile_options INTERFACE -fsanitize=${MLASERVE_SANITIZE})
endif()
if(MLASERVE_FUZZ)
  # Coverage feedback from all of mlaserve's code; the harnesses link libFuzzer's main.
  target_compile_options(mlaserve_compile_options INTERFACE -fsanitize=fuzzer-no-link)
endif()
