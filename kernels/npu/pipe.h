#ifndef MLASERVE_KERNELS_NPU_PIPE_H_
#define MLASERVE_KERNELS_NPU_PIPE_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace mlaserve::npu {

// The two kinds of core of a DaVinci V220 die. An AIC (cube core) multiplies matrices; an
// AIV (vector core) does element-wise work. They share data only through global memory.
enum class CoreKind : uint8_t { kCube, kVector };

// The in-order instruction queues of a core, each with its own timeline:
//   AIC: MTE2 (GM -> L1), MTE1 (L1 -> L0A/L0B), M (matrix), FIX (L0C -> GM)
//   AIV: MTE2 (GM -> UB), V (vector), MTE3 (UB -> GM)
enum class Pipe : uint8_t { kMte2, kMte1, kM, kFix, kV, kMte3 };
inline constexpr int kNumPipes = 6;

constexpr bool PipeExistsOn(CoreKind core, Pipe pipe) {
  if (core == CoreKind::kCube) {
    return pipe == Pipe::kMte2 || pipe == Pipe::kMte1 || pipe == Pipe::kM || pipe == Pipe::kFix;
  }
  return pipe == Pipe::kMte2 || pipe == Pipe::kV || pipe == Pipe::kMte3;
}

constexpr absl::string_view PipeName(Pipe pipe) {
  switch (pipe) {
    case Pipe::kMte2:
      return "MTE2";
    case Pipe::kMte1:
      return "MTE1";
    case Pipe::kM:
      return "M";
    case Pipe::kFix:
      return "FIX";
    case Pipe::kV:
      return "V";
    case Pipe::kMte3:
      return "MTE3";
  }
  return "?";
}

constexpr absl::string_view CoreKindName(CoreKind kind) {
  return kind == CoreKind::kCube ? "AIC" : "AIV";
}

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PIPE_H_
