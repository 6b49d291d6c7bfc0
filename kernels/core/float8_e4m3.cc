#include "kernels/core/float8_e4m3.h"

#include <array>

namespace mlaserve {
namespace {

constexpr std::array<Bf16, 256> MakeBf16Table() {
  std::array<Bf16, 256> table{};
  for (int code = 0; code < 256; ++code) {
    table[code] = Fp8E4m3::FromBits(static_cast<uint8_t>(code)).ToBf16();
  }
  return table;
}

constexpr std::array<Bf16, 256> kBf16OfCode = MakeBf16Table();

}  // namespace

void NarrowToFp8(const float* in, int64_t n, Fp8E4m3* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = Fp8E4m3::FromFloat(in[j]);
}

void WidenFp8ToBf16(const Fp8E4m3* in, int64_t n, Bf16* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = kBf16OfCode[in[j].bits];
}

}  // namespace mlaserve
