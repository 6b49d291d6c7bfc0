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
  # In the numeric kernels (targets with MLASERVE_NUMERIC_KERNELS set), UBSan's alignment,
  # null and pointer-overflow checks put a branch on every element access and keep the loops
  # from vectorising: the head-space kernel tests ran 25-50x slower than unsanitised, the
  # largest part of the sanitizer stage. AddressSanitizer still checks every access there (a
  # null or out-of-bounds one is still a finding), and UBSan's other checks (shifts, signed
  # overflow, bounds, float casts) stay on. After -fsanitize, so that they win.
  if(MLASERVE_SANITIZE MATCHES "undefined")
    target_compile_options(mlaserve_compile_options INTERFACE
      $<$<BOOL:$<TARGET_PROPERTY:MLASERVE_NUMERIC_KERNELS>>:-fno-sanitize=alignment,null,pointer-overflow>)
  endif()
endif()
# Test bodies (MLASERVE_TEST_BODY, set by mlaserve_test) are assertion macros and calls into
# the libraries, whose optimisation costs a third of their compile time and buys no speed:
# -O1, and -O0 under a sanitizer. The libraries keep the build type's level (-O3 in release,
# -O2 in the sanitizer trees), the code a user runs and the speed the tests judge: built at
# -O1 under ASan the service answered a client beside a TLS reset flood 1.5-2x slower
# (resource_limits_test), for 2 of the ASan tree's 15 CPU-minutes of compiling. After the build
# type's flags, so that these win.
set(mlaserve_test_body "$<BOOL:$<TARGET_PROPERTY:MLASERVE_TEST_BODY>>")
if(MLASERVE_SANITIZE)
  target_compile_options(mlaserve_compile_options INTERFACE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,${mlaserve_test_body}>:-O0>)
else()
  target_compile_options(mlaserve_compile_options INTERFACE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,${mlaserve_test_body}>:-O1>)
endif()
if(MLASERVE_FUZZ)
  # Coverage feedback from all of mlaserve's code; the harnesses link libFuzzer's main.
  target_compile_options(mlaserve_compile_options INTERFACE -fsanitize=fuzzer-no-link)
endif()
