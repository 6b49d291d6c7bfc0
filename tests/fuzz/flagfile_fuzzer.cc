// Flag files (--flagfile=PATH, as the unit's /etc/mlaserve/mlaserve.flags): the reader that
// splits them into arguments, expands nested flag files and normalises names.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "tests/fuzz/memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const mlaserve::fuzz::MemoryFile file(data, size);
  std::vector<std::string> args = {"mlaserve-server", "--flagfile=" + file.path(), "--listen",
                                   "127.0.0.1:0"};
  mlaserve::NormalizeFlagArguments(std::move(args)).IgnoreError();
  return 0;
}
