#ifndef MLASERVE_TESTS_TESTING_SCRATCH_DIR_H_
#define MLASERVE_TESTS_TESTING_SCRATCH_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "gtest/gtest.h"

namespace mlaserve::testing {

// A directory of the test's own under ::testing::TempDir(), removed with everything in it when
// the object goes: tests leave nothing behind. A test file that writes files keeps one as a
// function-local static, so it lasts the test process and goes at its exit.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view prefix) {
    std::string pattern =
        (std::filesystem::path(::testing::TempDir()) / (std::string(prefix) + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "cannot create a scratch directory from " << pattern;
    }
    dir_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string Path(std::string_view name) const { return (dir_ / std::string(name)).string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_SCRATCH_DIR_H_
