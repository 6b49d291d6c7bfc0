#ifndef MLASERVE_CLIENT_LOADGEN_SOAK_CHURN_H_
#define MLASERVE_CLIENT_LOADGEN_SOAK_CHURN_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace mlaserve::loadgen {

// The churn of one soak worker's sequences, without the RPCs: which call comes next and,
// once it succeeded, what every sequence then holds. KV rows are indices into the run's
// pool of random rows, so the book stays small and the golden can rebuild any sequence.
struct ChurnOptions {
  int sequences = 8;  // live at once; every decode call carries all of them
  int layers = 1;
  // The shared prefix's rows per layer ([layer][token], pool indices; empty: no prefix).
  std::vector<std::vector<int32_t>> prefix_rows;
  int min_prompt = 1, max_prompt = 64;  // own rows appended after creation
  int min_life = 4, max_life = 64;      // decode steps before the sequence is released
  double prefix_fraction = 0.7;         // of creations on the prefix (when there is one)
  double fork_fraction = 0.2;           // of replacements that fork a live sequence
  int row_pool = 4096;                  // rows are drawn from [0, row_pool)
  // A fork inherits its source's rows, so chains of forks could grow without end; a source is
  // eligible only if its own rows plus a full life stay within this (0: max_prompt +
  // 2 * max_life).
  int max_own_rows = 0;
};

enum class ChurnStep {
  kCreate,        // CreateSequence(id, prefix or none)
  kAppendPrompt,  // AppendKv of the new sequence's own prompt, every layer, at `position`
  kFork,          // ForkSequence(source_id, id)
  kDecode,        // one Decode call on `layer`: every live sequence appends a row, then attends
  kRelease,       // ReleaseSequence(id)
};

const char* ChurnStepName(ChurnStep step);

struct ChurnAction {
  ChurnStep step = ChurnStep::kCreate;
  int slot = -1;  // the sequence's slot (all but kDecode)
  std::string id;
  std::string source_id;   // kFork
  bool on_prefix = false;  // kCreate
  // kAppendPrompt: [layer] rows, all appended at `position`.
  std::vector<std::vector<int32_t>> prompt;
  int64_t position = 0;
  // kDecode: the layer, then per query (in order) its slot, the row it appends and where.
  int layer = 0;
  std::vector<int> slots;
  std::vector<int32_t> appends;
  std::vector<int64_t> positions;
};

// A live sequence as the client knows it.
struct SoakSequence {
  std::string id;  // empty: the slot is free
  bool on_prefix = false;
  bool ready = false;  // created and its prompt appended (or forked): it decodes
  bool retiring = false;
  int steps_left = 0;
  int steps_done = 0;
  std::vector<std::vector<int32_t>> rows;  // [layer] its own rows, after the prefix's
};

struct ChurnCounts {
  int64_t created = 0, forked = 0, released = 0, decode_steps = 0;
};

class ChurnBook {
 public:
  // Ids are `id_prefix` + "/" + a counter. The book starts with every slot free: the first
  // calls create the live set.
  ChurnBook(ChurnOptions options, std::string id_prefix, uint64_t seed);

  // The call to make next. It stays the same until Done(): a failed call changed nothing on
  // the server (every call here is idempotent), so it is retried as it is.
  const ChurnAction& Next();
  // The call Next() returned succeeded: book what it changed.
  void Done();

  const SoakSequence& slot(int i) const { return slots_[i]; }
  int slots() const { return static_cast<int>(slots_.size()); }
  // Rows the server holds for the sequence in `slot` on `layer`: the prefix's, then its own.
  int64_t Length(int slot, int layer) const;
  std::vector<int32_t> KeyRows(int slot, int layer) const;
  // Ids the server holds for this book (created, not yet released), plus the pending call's
  // new id: what the end of a run must release.
  std::vector<std::string> LiveIds() const;
  const ChurnCounts& counts() const { return counts_; }
  const ChurnOptions& options() const { return options_; }

 private:
  ChurnAction Plan();
  int Draw(int lo, int hi);  // uniform in [lo, hi]
  std::string NewId();

  ChurnOptions options_;
  std::string id_prefix_;
  std::mt19937_64 rng_;
  std::vector<SoakSequence> slots_;
  std::optional<ChurnAction> pending_;
  int layer_ = 0;  // the next decode call's layer: a decode step visits every layer in order
  int64_t next_id_ = 0;
  ChurnCounts counts_;
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_SOAK_CHURN_H_
