# Project-wide compile settings, applied only to mlaserve's own targets (generated protobuf
# code and third-party headers are not held to them).
add_library(mlaserve_compile_options INTERFACE)
target_compile_options(mlaserve_compile_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wimplicit-fallthrough)
if(MLASERVE_WERROR)
  target_compile_options(mlaserve_compile_options INTERFACE -Werror)
endif()
if(MLASERVE_NATIVE)
  target_compile_options(mlaserve_compile_options INTERFACE -march=native)
endif()
if(MLASERVE_SANITIZE)
  target_compile_options(mlaserve_compile_options INTERFACE
    -fsanitize=${MLASERVE_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(mlaserve_compile_options INTERFACE -fsanitize=${MLASERVE_SANITIZE})
endif()
