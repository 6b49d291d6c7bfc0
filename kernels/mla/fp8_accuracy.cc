#include "kernels/mla/fp8_accuracy.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/core/float8_e4m3.h"
#include "kernels/core/fp8_latent_row.h"

namespace mlaserve {
namespace {

constexpr int kBlockTokens = 64;
constexpr int kBlockChannels = 64;
constexpr double kChannelLogSigma = 0.75;  // real-shaped keys: per-channel magnitudes
constexpr double kTokenLogSigma = 1.0;     // and per-token magnitudes, both log-normal

double ContentAmax(std::span<const Bf16> rows, int first, int count, int width, int c0, int c1) {
  double amax = 0.0;
  for (int t = first; t < first + count; ++t) {
    for (int c = c0; c < c1; ++c) {
      amax = std::max(
          amax, std::fabs(static_cast<double>(rows[static_cast<size_t>(t) * width + c].ToFloat())));
    }
  }
  return amax;
}

// e4m3 with a given scale, back in real units.
double Fp8Value(double x, double scale) {
  return Fp8E4m3::FromFloat(static_cast<float>(x / scale)).ToFloat() * scale;
}

}  // namespace

std::vector<KvDataSet> AllKvDataSets() {
  return {KvDataSet::kGaussian, KvDataSet::kRopeOutliers, KvDataSet::kHeavyTailed};
}

std::string_view KvDataSetName(KvDataSet set) {
  switch (set) {
    case KvDataSet::kGaussian:
      return "gaussian";
    case KvDataSet::kRopeOutliers:
      return "rope-outliers";
    case KvDataSet::kHeavyTailed:
      return "heavy-tailed";
  }
  return "?";
}

KvDataSampler::KvDataSampler(KvDataSet set, int dl, int dr, Rng& rng, double scale)
    : set_(set),
      dl_(dl),
      dr_(dr),
      scale_(scale),
      key_sigma_(dl + dr, 1.0),
      query_sigma_(dl + dr, 1.0) {
  switch (set) {
    case KvDataSet::kGaussian:
      break;
    case KvDataSet::kRopeOutliers: {
      // Each RoPE channel of the keys is 10^2..10^3 times wider than the content; the query's
      // matching channel is narrower by as much (times 5.6), so the RoPE term of a score
      // carries about twice the content term's spread, as position does in a real layer.
      for (int c = dl; c < dl + dr; ++c) {
        key_sigma_[c] = std::pow(10.0, UniformReal(2.0, 3.0, rng));
        query_sigma_[c] = 5.6 / key_sigma_[c];
      }
      break;
    }
    case KvDataSet::kHeavyTailed: {
      // Divided by their RMS (E[exp(2 N(0, s^2))] = exp(2 s^2)), so that the content's RMS is
      // 1 as in the other sets: the scale sets the scores' spread, the set their shape.
      NormalSampler<double> log_sigma(0.0, kChannelLogSigma);
      const double rms = std::exp(kChannelLogSigma * kChannelLogSigma);
      for (int c = 0; c < dl; ++c) key_sigma_[c] = std::exp(log_sigma(rng)) / rms;
      for (int c = dl; c < dl + dr; ++c) {
        key_sigma_[c] = 30.0 * std::exp(log_sigma(rng)) / rms;
        query_sigma_[c] = 1.0 / 30.0;
      }
      break;
    }
  }
}

void KvDataSampler::FillKeys(std::span<Bf16> rows, Rng& rng) const {
  const int width = dl_ + dr_;
  NormalSampler<double> normal(0.0, 1.0);
  std::student_t_distribution<double> student(3.0);
  const bool heavy = set_ == KvDataSet::kHeavyTailed;
  double token_scale = scale_;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int c = static_cast<int>(i % width);
    if (c == 0 && heavy) {
      token_scale = scale_ * std::exp(kTokenLogSigma * normal(rng)) /
                    std::exp(kTokenLogSigma * kTokenLogSigma);
    }
    // Student-t(3) has variance 3; divided by sqrt(3) its spread matches sigma.
    const double draw = heavy ? student(rng) / std::sqrt(3.0) : normal(rng);
    rows[i] = Bf16::FromFloat(static_cast<float>(draw * key_sigma_[c] * token_scale));
  }
}

void KvDataSampler::FillQueries(std::span<Bf16> rows, Rng& rng) const {
  const int width = dl_ + dr_;
  NormalSampler<double> normal(0.0, 1.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = Bf16::FromFloat(static_cast<float>(normal(rng) * query_sigma_[i % width] * scale_));
  }
}

std::vector<KvFormat> AllKvFormats() {
  return {KvFormat::kBf16,
          KvFormat::kFp8RopeAware,
          KvFormat::kFp8RopeQuantized,
          KvFormat::kFp8TensorStatic,
          KvFormat::kFp8TensorDynamic,
          KvFormat::kFp8Block};
}

std::string_view KvFormatName(KvFormat format) {
  switch (format) {
    case KvFormat::kBf16:
      return "bf16";
    case KvFormat::kFp8RopeAware:
      return "fp8-rope-aware";
    case KvFormat::kFp8RopeQuantized:
      return "fp8-rope-quantized";
    case KvFormat::kFp8TensorStatic:
      return "fp8-tensor-static";
    case KvFormat::kFp8TensorDynamic:
      return "fp8-tensor-dynamic";
    case KvFormat::kFp8Block:
      return "fp8-block";
  }
  return "?";
}

int64_t KvBytesPerToken(KvFormat format, int dl, int dr) {
  switch (format) {
    case KvFormat::kBf16:
      return 2 * static_cast<int64_t>(dl + dr);
    case KvFormat::kFp8RopeAware:
      return dl + 4 + 2 * static_cast<int64_t>(dr);
    case KvFormat::kFp8RopeQuantized:
      return dl + dr + 4;
    case KvFormat::kFp8TensorStatic:
    case KvFormat::kFp8TensorDynamic:
      return dl + 2 * static_cast<int64_t>(dr);  // one scale per tensor, not per token
    case KvFormat::kFp8Block:
      // One fp32 scale per 64 x 64 block, spread over its 64 tokens.
      return dl + 2 * static_cast<int64_t>(dr) + (dl / kBlockChannels) * 4 / kBlockTokens;
  }
  return 0;
}

std::vector<double> QuantizedKeyValues(KvFormat format, std::span<const Bf16> rows, int n, int dl,
                                       int dr) {
  const int width = dl + dr;
  std::vector<double> out(static_cast<size_t>(n) * width);
  for (size_t i = 0; i < out.size(); ++i) out[i] = rows[i].ToFloat();
  auto content = [&](int t, int c) -> double& { return out[static_cast<size_t>(t) * width + c]; };
  switch (format) {
    case KvFormat::kBf16:
      break;
    case KvFormat::kFp8RopeAware: {
      std::vector<Fp8E4m3> q8(dl);
      std::vector<Bf16> rope(dr);
      std::vector<float> row(width);
      for (int t = 0; t < n; ++t) {
        float scale = 0.0f;
        QuantizeLatentRow(rows.data() + static_cast<size_t>(t) * width, dl, dr,
                          Fp8LatentRow{q8.data(), &scale, rope.data()});
        DequantizeLatentRow(q8.data(), scale, rope.data(), dl, dr, row.data());
        for (int c = 0; c < width; ++c) content(t, c) = row[c];
      }
      break;
    }
    case KvFormat::kFp8RopeQuantized:
      for (int t = 0; t < n; ++t) {
        const double scale =
            std::max(ContentAmax(rows, t, 1, width, 0, width), double{kFp8AmaxFloor}) / 448.0;
        for (int c = 0; c < width; ++c) content(t, c) = Fp8Value(content(t, c), scale);
      }
      break;
    case KvFormat::kFp8TensorStatic:
    case KvFormat::kFp8TensorDynamic: {
      const double scale =
          format == KvFormat::kFp8TensorStatic
              ? 1.0
              : std::max(ContentAmax(rows, 0, n, width, 0, dl), double{kFp8AmaxFloor}) / 448.0;
      for (int t = 0; t < n; ++t)
        for (int c = 0; c < dl; ++c) content(t, c) = Fp8Value(content(t, c), scale);
      break;
    }
    case KvFormat::kFp8Block:
      for (int t0 = 0; t0 < n; t0 += kBlockTokens) {
        const int tokens = std::min(kBlockTokens, n - t0);
        for (int c0 = 0; c0 < dl; c0 += kBlockChannels) {
          const int c1 = std::min(dl, c0 + kBlockChannels);
          const double scale =
              std::max(ContentAmax(rows, t0, tokens, width, c0, c1), double{kFp8AmaxFloor}) / 448.0;
          for (int t = t0; t < t0 + tokens; ++t)
            for (int c = c0; c < c1; ++c) content(t, c) = Fp8Value(content(t, c), scale);
        }
      }
      break;
  }
  return out;
}

KeyErrors CompareKeys(std::span<const double> held, std::span<const Bf16> rows, int n, int dl,
                      int dr) {
  const int width = dl + dr;
  double diff[2] = {0, 0}, norm[2] = {0, 0};
  for (int t = 0; t < n; ++t) {
    for (int c = 0; c < width; ++c) {
      const size_t i = static_cast<size_t>(t) * width + c;
      const double x = rows[i].ToFloat();
      const int part = c < dl ? 0 : 1;
      diff[part] += (held[i] - x) * (held[i] - x);
      norm[part] += x * x;
    }
  }
  return {std::sqrt(diff[0]) / (std::sqrt(norm[0]) + 1e-30),
          std::sqrt(diff[1]) / (std::sqrt(norm[1]) + 1e-30)};
}

AttentionErrors CompareWithGolden(std::span<const float> out, std::span<const float> lse,
                                  const GoldenOutput& golden) {
  GoldenOutput actual;
  actual.out.assign(out.begin(), out.end());
  actual.lse.assign(lse.begin(), lse.end());
  return CompareWithGolden(actual, golden);
}

AttentionErrors CompareWithGolden(const GoldenOutput& actual, const GoldenOutput& golden) {
  double diff = 0, norm = 0, actual_norm = 0, dot = 0;
  for (size_t i = 0; i < golden.out.size(); ++i) {
    const double a = actual.out[i];
    const double g = golden.out[i];
    diff += (a - g) * (a - g);
    norm += g * g;
    actual_norm += a * a;
    dot += a * g;
  }
  AttentionErrors e;
  e.rel_l2 = std::sqrt(diff) / (std::sqrt(norm) + 1e-30);
  e.cos_dist = 1.0 - dot / (std::sqrt(norm * actual_norm) + 1e-30);
  e.rmse = golden.out.empty() ? 0.0 : std::sqrt(diff / static_cast<double>(golden.out.size()));
  for (size_t i = 0; i < golden.lse.size(); ++i) {
    if (!std::isfinite(golden.lse[i])) continue;
    e.lse_max_err = std::max(e.lse_max_err, std::fabs(actual.lse[i] - golden.lse[i]));
  }
  return e;
}

}  // namespace mlaserve
