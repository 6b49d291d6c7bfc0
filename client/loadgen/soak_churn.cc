#include "client/loadgen/soak_churn.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mlaserve::loadgen {

const char* ChurnStepName(ChurnStep step) {
  switch (step) {
    case ChurnStep::kCreate:
      return "CreateSequence";
    case ChurnStep::kAppendPrompt:
      return "AppendKv";
    case ChurnStep::kFork:
      return "ForkSequence";
    case ChurnStep::kDecode:
      return "Decode";
    case ChurnStep::kRelease:
      return "ReleaseSequence";
  }
  return "?";
}

ChurnBook::ChurnBook(ChurnOptions options, std::string id_prefix, uint64_t seed)
    : options_(std::move(options)),
      id_prefix_(std::move(id_prefix)),
      rng_(seed),
      slots_(std::max(options_.sequences, 1)) {
  if (options_.max_own_rows <= 0) {
    options_.max_own_rows = options_.max_prompt + 2 * options_.max_life;
  }
}

int ChurnBook::Draw(int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng_);
}

std::string ChurnBook::NewId() { return absl::StrCat(id_prefix_, "/", next_id_++); }

int64_t ChurnBook::Length(int slot, int layer) const {
  const SoakSequence& s = slots_[slot];
  const int64_t prefix = s.on_prefix ? static_cast<int64_t>(options_.prefix_rows[layer].size()) : 0;
  return prefix + static_cast<int64_t>(s.rows[layer].size());
}

std::vector<int32_t> ChurnBook::KeyRows(int slot, int layer) const {
  const SoakSequence& s = slots_[slot];
  std::vector<int32_t> keys;
  if (s.on_prefix) keys = options_.prefix_rows[layer];
  keys.insert(keys.end(), s.rows[layer].begin(), s.rows[layer].end());
  return keys;
}

std::vector<std::string> ChurnBook::LiveIds() const {
  std::vector<std::string> ids;
  for (const SoakSequence& s : slots_) {
    if (!s.id.empty()) ids.push_back(s.id);
  }
  // A create or fork that failed, or whose answer was lost, may still have happened.
  if (pending_.has_value() &&
      (pending_->step == ChurnStep::kCreate || pending_->step == ChurnStep::kFork)) {
    ids.push_back(pending_->id);
  }
  return ids;
}

const ChurnAction& ChurnBook::Next() {
  if (!pending_.has_value()) pending_ = Plan();
  return *pending_;
}

ChurnAction ChurnBook::Plan() {
  ChurnAction a;
  // Retired sequences leave first, so the live set never exceeds `sequences`.
  for (int i = 0; i < slots(); ++i) {
    if (!slots_[i].id.empty() && slots_[i].retiring) {
      a.step = ChurnStep::kRelease;
      a.slot = i;
      a.id = slots_[i].id;
      return a;
    }
  }
  // Then free slots are refilled: a fork of a live sequence, or a new one.
  for (int i = 0; i < slots(); ++i) {
    const SoakSequence& s = slots_[i];
    if (!s.id.empty() && s.ready) continue;
    a.slot = i;
    if (!s.id.empty()) {  // created: its prompt follows
      a.step = ChurnStep::kAppendPrompt;
      a.id = s.id;
      a.position = Length(i, 0);
      const int n = Draw(options_.min_prompt, options_.max_prompt);
      a.prompt.resize(options_.layers);
      for (std::vector<int32_t>& rows : a.prompt) {
        for (int t = 0; t < n; ++t) rows.push_back(Draw(0, options_.row_pool - 1));
      }
      return a;
    }
    std::vector<int> sources;
    for (int j = 0; j < slots(); ++j) {
      const SoakSequence& c = slots_[j];
      if (!c.id.empty() && c.ready &&
          static_cast<int>(c.rows[0].size()) + options_.max_life <= options_.max_own_rows) {
        sources.push_back(j);
      }
    }
    a.id = NewId();
    if (!sources.empty() &&
        std::uniform_real_distribution<double>(0, 1)(rng_) < options_.fork_fraction) {
      a.step = ChurnStep::kFork;
      a.source_id = slots_[sources[Draw(0, static_cast<int>(sources.size()) - 1)]].id;
      return a;
    }
    a.step = ChurnStep::kCreate;
    a.on_prefix = !options_.prefix_rows.empty() &&
                  std::uniform_real_distribution<double>(0, 1)(rng_) < options_.prefix_fraction;
    return a;
  }
  // Every slot is live: one decode call, on the step's next layer.
  a.step = ChurnStep::kDecode;
  a.layer = layer_;
  for (int i = 0; i < slots(); ++i) {
    a.slots.push_back(i);
    a.appends.push_back(Draw(0, options_.row_pool - 1));
    a.positions.push_back(Length(i, layer_));
  }
  return a;
}

void ChurnBook::Done() {
  if (!pending_.has_value()) return;
  ChurnAction a = *std::move(pending_);
  pending_.reset();
  switch (a.step) {
    case ChurnStep::kCreate: {
      SoakSequence& s = slots_[a.slot];
      s = SoakSequence{};
      s.id = a.id;
      s.on_prefix = a.on_prefix;
      s.rows.resize(options_.layers);
      s.steps_left = Draw(options_.min_life, options_.max_life);
      ++counts_.created;
      break;
    }
    case ChurnStep::kAppendPrompt: {
      SoakSequence& s = slots_[a.slot];
      for (int l = 0; l < options_.layers; ++l) {
        s.rows[l].insert(s.rows[l].end(), a.prompt[l].begin(), a.prompt[l].end());
      }
      s.ready = true;
      break;
    }
    case ChurnStep::kFork: {
      const auto source = std::find_if(slots_.begin(), slots_.end(),
                                       [&](const SoakSequence& s) { return s.id == a.source_id; });
      SoakSequence& s = slots_[a.slot];
      s = *source;  // the server copies every row (copy-on-write); so does the book
      s.id = a.id;
      s.retiring = false;
      s.steps_done = 0;
      s.steps_left = Draw(options_.min_life, options_.max_life);
      ++counts_.forked;
      break;
    }
    case ChurnStep::kDecode: {
      for (size_t q = 0; q < a.slots.size(); ++q) {
        slots_[a.slots[q]].rows[a.layer].push_back(a.appends[q]);
      }
      if (++layer_ < options_.layers) break;
      // The step is complete once every layer has its row.
      layer_ = 0;
      ++counts_.decode_steps;
      for (SoakSequence& s : slots_) {
        ++s.steps_done;
        if (--s.steps_left <= 0) s.retiring = true;
      }
      break;
    }
    case ChurnStep::kRelease:
      slots_[a.slot] = SoakSequence{};
      ++counts_.released;
      break;
  }
}

}  // namespace mlaserve::loadgen
