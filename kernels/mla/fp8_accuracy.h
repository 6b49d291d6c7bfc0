#ifndef MLASERVE_KERNELS_MLA_FP8_ACCURACY_H_
#define MLASERVE_KERNELS_MLA_FP8_ACCURACY_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/random_fill.h"
#include "kernels/reference/golden_attention.h"

namespace mlaserve {

// What the FP8 cache is judged on (docs/numerics.md, "FP8 accuracy"): data sets shaped like
// MLA's latent rows, KV formats (the served ones and SnapMLA's Table 2 ablations), and the
// metrics SnapMLA and its public tests report, all against the fp64 golden on unquantised data.

// Latent rows [content (dl) | rope (dr)] of keys and the matching latent queries. Every value
// is then multiplied by the sampler's `scale`; at the default 0.1 the content is FlashMLA's and
// SnapMLA's public test recipe (randn / 10), which their tolerances were set on. Scores grow
// with scale^2, and with them the softmax's peak and the FP8 error (docs/numerics.md).
enum class KvDataSet {
  kGaussian,      // everything N(0, 1)
  kRopeOutliers,  // content N(0, 1); each key RoPE channel 100-1000x wider (SnapMLA Fig. 3)
  // Real-shaped keys: per-channel (log-normal, sigma 0.75) and per-token (log-normal, sigma 1)
  // magnitudes times Student-t(3) draws, RoPE channels ~30x wider; Gaussian queries. The
  // magnitudes are divided by their RMS, so the content's RMS is 1 as in the other sets.
  kHeavyTailed,
};

inline constexpr double kPublicTestDataScale = 0.1;

std::vector<KvDataSet> AllKvDataSets();
std::string_view KvDataSetName(KvDataSet set);

// One draw of a data set's channel profile; keys and queries drawn from it are consistent
// (the same wide RoPE channels for every token), as a layer's cache is.
class KvDataSampler {
 public:
  KvDataSampler(KvDataSet set, int dl, int dr, Rng& rng, double scale = kPublicTestDataScale);

  void FillKeys(std::span<Bf16> rows, Rng& rng) const;     // [n][dl + dr]
  void FillQueries(std::span<Bf16> rows, Rng& rng) const;  // [n][dl + dr]

 private:
  KvDataSet set_;
  int dl_;
  int dr_;
  double scale_;
  std::vector<double> key_sigma_;    // [dl + dr]
  std::vector<double> query_sigma_;  // [dl + dr]
};

// How a layer's keys are held.
enum class KvFormat {
  kBf16,
  kFp8RopeAware,      // SnapMLA: per-token content scale, RoPE bf16 in the scaled domain
  kFp8RopeQuantized,  // Config A: one per-token scale over content and RoPE, both e4m3
  kFp8TensorStatic,   // Config B: content e4m3 with the fixed scale 1.0, RoPE bf16
  kFp8TensorDynamic,  // Config C: one content scale for the whole tensor (amax / 448)
  kFp8Block,          // Config D: one content scale per block of 64 tokens x 64 channels
};

std::vector<KvFormat> AllKvFormats();
std::string_view KvFormatName(KvFormat format);
int64_t KvBytesPerToken(KvFormat format, int dl, int dr);

// The values `rows` ([n][dl + dr], one sequence's keys in token order) stand for once held
// in `format`, in fp64.
std::vector<double> QuantizedKeyValues(KvFormat format, std::span<const Bf16> rows, int n, int dl,
                                       int dr);

// ||held - original|| / ||original|| of the content and of the RoPE part of `rows`
// ([n][dl + dr]), where `held` is QuantizedKeyValues' answer: what the format itself loses,
// before any attention.
struct KeyErrors {
  double content_rel_l2 = 0;
  double rope_rel_l2 = 0;
};
KeyErrors CompareKeys(std::span<const double> held, std::span<const Bf16> rows, int n, int dl,
                      int dr);

struct AttentionErrors {
  double rel_l2 = 0;       // ||out - golden|| / ||golden||
  double cos_dist = 0;     // 1 - cos(out, golden), over the whole tensor
  double rmse = 0;         // sqrt(mean (out - golden)^2)
  double lse_max_err = 0;  // max |lse - golden lse| over rows that see keys
};

AttentionErrors CompareWithGolden(std::span<const float> out, std::span<const float> lse,
                                  const GoldenOutput& golden);
AttentionErrors CompareWithGolden(const GoldenOutput& actual, const GoldenOutput& golden);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_FP8_ACCURACY_H_
