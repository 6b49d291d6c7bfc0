#include "tests/testing/batch_invariance_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/core/element_type.h"

namespace mlaserve::testing {
namespace {

struct Pick {
  int group = 0;
  int member = 0;
};

// The batch of `picks` (repeats allowed) out of `whole`: groups in order of first pick, each
// with its picked members in pick order; `where[g][m]` is the pick behind answer (g, m).
DecodeBatch Select(const DecodeBatch& whole, const std::vector<Pick>& picks,
                   std::vector<std::vector<Pick>>& where) {
  DecodeBatch batch = whole;
  batch.groups.clear();
  where.clear();
  std::map<int, int> group_of;
  for (const Pick& p : picks) {
    auto [it, inserted] = group_of.try_emplace(p.group, static_cast<int>(batch.groups.size()));
    if (inserted) {
      DecodeBatch::Group group = whole.groups[p.group];
      group.members.clear();
      batch.groups.push_back(std::move(group));
      where.emplace_back();
    }
    batch.groups[it->second].members.push_back(whole.groups[p.group].members[p.member]);
    where[it->second].push_back(p);
  }
  return batch;
}

// Every member alone, in the mode or out of it: [group][member].
BatchAnswerBytes AloneAnswers(const BatchRunner& run, const DecodeBatch& whole) {
  BatchAnswerBytes alone(whole.groups.size());
  for (int g = 0; g < static_cast<int>(whole.groups.size()); ++g) {
    for (int m = 0; m < static_cast<int>(whole.groups[g].members.size()); ++m) {
      std::vector<std::vector<Pick>> where;
      absl::StatusOr<BatchAnswerBytes> answers = run(Select(whole, {{g, m}}, where));
      EXPECT_TRUE(answers.ok()) << "group " << g << " member " << m
                                << " alone: " << answers.status();
      alone[g].push_back(answers.ok() ? (*answers)[0][0] : AnswerBytes{});
    }
  }
  return alone;
}

// Where two answers of a group's member part: "out byte 1234" or "lse of row 5".
std::string FirstDifference(const AnswerBytes& got, const AnswerBytes& want,
                            const DecodeBatch::Group& group, int heads) {
  if (got.size() != want.size()) return absl::StrCat(got.size(), " bytes, not ", want.size());
  const size_t lse_bytes = static_cast<size_t>(group.sq) * heads * sizeof(float);
  const size_t out_bytes = got.size() - lse_bytes;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    return i < out_bytes ? absl::StrCat("out byte ", i, " of ", out_bytes)
                         : absl::StrCat("lse of row ", (i - out_bytes) / sizeof(float));
  }
  return "none";
}

}  // namespace

BatchAnswerBytes ReadAnswerBytes(const BuiltBatch& built, const BatchBuffers& buffers) {
  BatchAnswerBytes all(built.answers.size());
  for (size_t g = 0; g < built.answers.size(); ++g) {
    for (const AnswerRef& ref : built.answers[g]) {
      const int64_t width = ElementBytes(ref.out_type);
      const std::span<const std::byte> out =
          buffers.Bytes(ref.out.buffer)
              .subspan(static_cast<size_t>(ref.out.offset * width),
                       static_cast<size_t>(ref.out_elements * width));
      const std::span<const std::byte> lse =
          buffers.Bytes(ref.lse.buffer)
              .subspan(static_cast<size_t>(ref.lse.offset) * sizeof(float),
                       static_cast<size_t>(ref.lse_elements) * sizeof(float));
      AnswerBytes bytes(out.begin(), out.end());
      bytes.insert(bytes.end(), lse.begin(), lse.end());
      all[g].push_back(std::move(bytes));
    }
  }
  return all;
}

BatchScenarioSpec InvarianceScenario(int heads, bool weight_tiles) {
  BatchScenarioSpec spec;
  spec.heads = heads;
  spec.data_scale = 0.1;
  spec.weight_tiles = weight_tiles;
  spec.groups = {
      {.head_space = true,
       .sq = 1,
       .own_tokens = {1, 7, 64, 65, 300, 1000, 2049, 4100, 5000},
       .out_bf16 = true},
      {.head_space = true, .sq = 2, .own_tokens = {3, 513, 2500}},
      {.head_space = false, .sq = 1, .own_tokens = {2, 129, 1537, 4096}, .out_bf16 = true},
      {.head_space = false, .sq = 2, .own_tokens = {700, 3000}},
      {.head_space = true,
       .sq = 1,
       .own_tokens = {90, 2100},
       .out_bf16 = true,
       .kv_dtype = KvDtype::kFp8},
  };
  return spec;
}

void ExpectBatchInvariant(const BatchRunner& run, const BatchScenarioSpec& spec, uint64_t seed,
                          InvarianceOptions options) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto s = BatchScenario::Make(spec, seed);
  DecodeBatch whole = s->batch();
  whole.batch_invariant = true;
  std::vector<Pick> members;
  for (int g = 0; g < static_cast<int>(whole.groups.size()); ++g) {
    for (int m = 0; m < static_cast<int>(whole.groups[g].members.size()); ++m)
      members.push_back({g, m});
  }
  const BatchAnswerBytes alone = AloneAnswers(run, whole);
  DecodeBatch whole_default = whole;
  whole_default.batch_invariant = false;
  const BatchAnswerBytes alone_default =
      options.expect_default_varies ? AloneAnswers(run, whole_default) : BatchAnswerBytes{};

  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + 1);
  std::vector<int> sizes = {2, options.max_batch};
  // Sizes spread evenly in log between 3 and max_batch, so small and large batches both come.
  std::uniform_real_distribution<double> log_size(std::log(3.0), std::log(options.max_batch));
  for (int t = 0; t < options.trials; ++t)
    sizes.push_back(static_cast<int>(std::lround(std::exp(log_size(rng)))));
  std::uniform_int_distribution<size_t> any(0, members.size() - 1);
  int default_changed = 0;
  for (int size : sizes) {
    std::vector<Pick> picks;
    for (int i = 0; i < size; ++i) picks.push_back(members[any(rng)]);
    std::vector<std::vector<Pick>> where;
    for (const bool invariant : {true, false}) {
      if (!invariant && !options.expect_default_varies) continue;
      DecodeBatch batch = Select(invariant ? whole : whole_default, picks, where);
      absl::StatusOr<BatchAnswerBytes> answers = run(batch);
      ASSERT_TRUE(answers.ok()) << "a batch of " << size << ": " << answers.status();
      int differ = 0;
      for (size_t g = 0; g < where.size(); ++g) {
        for (size_t m = 0; m < where[g].size(); ++m) {
          const Pick p = where[g][m];
          const AnswerBytes& want = (invariant ? alone : alone_default)[p.group][p.member];
          if ((*answers)[g][m] == want) continue;
          ++differ;
          if (invariant && differ <= 3) {
            ADD_FAILURE() << "in a batch of " << size << " (" << where.size() << " groups), group "
                          << p.group << " member " << p.member << " answered otherwise than alone: "
                          << FirstDifference((*answers)[g][m], want, batch.groups[g],
                                             batch.dims.heads);
          }
        }
      }
      if (!invariant) default_changed += differ;
    }
  }
  if (options.expect_default_varies) {
    EXPECT_GT(default_changed, 0)
        << "out of the mode no answer changed with its batch: these batches do not vary what "
           "the mode pins on this device, so the check above proves nothing";
  }
}

}  // namespace mlaserve::testing
