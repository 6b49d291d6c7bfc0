#ifndef MLASERVE_TESTS_TESTING_LATENT_DIMS_H_
#define MLASERVE_TESTS_TESTING_LATENT_DIMS_H_

namespace mlaserve::testing {

// DeepSeek-V3's and Kimi K2's latent widths, for tests written against those models' rows.
inline constexpr int kDl = 512;  // the latent c_kv width (kv_lora_rank)
inline constexpr int kDr = 64;   // the decoupled RoPE width (qk_rope_head_dim)

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_LATENT_DIMS_H_
