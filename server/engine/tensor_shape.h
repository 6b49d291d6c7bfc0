#ifndef MLASERVE_SERVER_ENGINE_TENSOR_SHAPE_H_
#define MLASERVE_SERVER_ENGINE_TENSOR_SHAPE_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlaserve::engine {

// The shapes request fields must have, as the engine's validation and the wire decoders
// state and print them.

// A dimension of an expected shape that the request chooses (a row count); it must be >= 1.
inline constexpr int64_t kAnyExtent = -1;

// Same rank, every fixed extent equal, every kAnyExtent at least 1.
inline bool ShapeMatches(std::span<const int64_t> shape, std::span<const int64_t> expected) {
  if (shape.size() != expected.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (expected[i] == kAnyExtent ? shape[i] < 1 : shape[i] != expected[i]) return false;
  }
  return true;
}

// "[1,128,64]"; kAnyExtent prints as "n".
inline std::string ShapeToString(std::span<const int64_t> shape) {
  return absl::StrCat(
      "[",
      absl::StrJoin(shape, ",",
                    [](std::string* out, int64_t d) {
                      absl::StrAppend(out, d == kAnyExtent ? std::string("n") : absl::StrCat(d));
                    }),
      "]");
}

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_TENSOR_SHAPE_H_
