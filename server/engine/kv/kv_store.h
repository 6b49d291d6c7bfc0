#ifndef MLASERVE_SERVER_ENGINE_KV_KV_STORE_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/kv/expanded_kv_cache.h"
#include "server/engine/kv/kv_checkpoint.h"
#include "server/engine/kv/kv_snapshot.h"
#include "server/engine/kv/kv_state.h"
#include "server/engine/kv/kv_types.h"
#include "server/engine/kv/page_allocator.h"
#include "server/engine/kv/page_pool.h"
#include "server/engine/kv/prefix_key.h"
#include "server/engine/kv/prefix_tree.h"
#include "server/engine/model/model_config.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::engine {

// The paged latent KV cache of one model, with shared prefixes (docs/engine.md, "KV store").
//
// Layout. One PagePool of fixed-size pages holds every layer's latent rows (c_kv then k_pe,
// dl + dr bf16). A sequence holds, per layer, a page list and a length; layers are appended
// to independently (a forward pass writes layer 0 before layer 1). A prefix is a registered
// run of tokens with rows for every layer; it may extend a parent prefix, forming a tree.
// Page lists always cover tokens from 0, so a sequence's list starts with its prefix chain's
// pages and any kernel can read it as one block table.
//
// Sharing. Pages are reference-counted by the page lists that hold them; a page held by two
// lists is never written. Starting a sequence on a prefix or forking a sequence copies page
// lists, not rows; the partly filled last page is copied on the first append by any holder
// (copy-on-write), and so is a parent prefix's last page when a child prefix is registered.
//
// Budget and eviction. Latent pages in use plus expanded K/V stay within the byte budget. An
// operation that needs memory first evicts, least recently used first, prefixes nothing
// references (registered, but with no child, sequence, snapshot or handle) and expanded K/V
// no handle pins; if that cannot make room it fails with RESOURCE_EXHAUSTED and changes
// nothing, not even the evictions. Referenced data is never dropped.
//
// Ids and retries. Ids are client-chosen strings (1..1024 bytes); prefixes and sequences
// have separate namespaces. Every mutation is idempotent under retry: a create, fork or
// register that repeats an existing one succeeds without effect (a different one with the
// same id is ALREADY_EXISTS); an append of rows already appended succeeds without effect;
// releasing an unknown id succeeds (a retry cannot be told from a never-used id). Invalid
// arguments are INVALID_ARGUMENT naming the field, unknown ids NOT_FOUND; a failed call
// changes nothing.
//
// Threads. All methods are thread-safe. One mutex guards the metadata; row copies (appends,
// prefix registration, copy-on-write) and expansions run outside it: the pages are reserved
// under the lock, filled without it, and published under it. An operation that depends on a
// copy in flight waits for it: an append or retry on the same sequence layer, a fork or
// release of the sequence, anything naming a prefix being registered, a request for an
// expansion being built. Decode reads through a KvSnapshot, which pins what it references,
// so kernels run without any lock.
class KvStore {
 public:
  // INVALID_ARGUMENT for a bad model config, a non-positive page size or a budget below one
  // page; RESOURCE_EXHAUSTED if the pool's address space cannot be mapped.
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const ModelConfig& model,
                                                         const KvStoreOptions& options);

  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;
  // Every snapshot and expanded K/V handle must be gone.
  ~KvStore();

  const ModelConfig& model() const { return model_; }
  int page_size() const { return pool_.page_size(); }
  KvDtype default_kv_dtype() const { return default_kv_dtype_; }
  // The whole pool as the kernels' paged cache (what KvSnapshot::cache() returns).
  PagedKvCache PoolView() const { return pool_.View(); }

  // --- Prefixes -------------------------------------------------------------------------

  // Registers `latent` ([layers][tokens][dl + dr], rows contiguous) as prefix `prefix_id`,
  // extending `parent_id` if that is not empty (its tokens follow the parent's), held in
  // `kv_dtype` (FP8 rows are quantised here); unset, a child takes its parent's format and a
  // root the store's default. A sequence created on it reads the parent chain's tokens, then
  // these. Fails with NOT_FOUND for an unknown parent, INVALID_ARGUMENT naming kv_dtype for a
  // child of another format than its parent, ALREADY_EXISTS if the id is registered with
  // another parent, format or rows, RESOURCE_EXHAUSTED if the rows do not fit.
  absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                              TensorView<const Bf16, 3> latent,
                              std::optional<KvDtype> kv_dtype = std::nullopt);

  // Drops the client's registration: the id becomes free at once. Whatever still references
  // the prefix (sequences started on it, child prefixes, snapshots, handles) keeps it alive,
  // anonymous and unevictable; it is freed when its last reference goes.
  absl::Status ReleasePrefix(absl::string_view prefix_id);

  absl::StatusOr<PrefixInfo> GetPrefix(absl::string_view prefix_id) const;

  // The registered, ready prefixes in `range` (admin listings). Linear in the prefixes held.
  ListPage<PrefixListing> ListPrefixes(const ListRange& range) const;

  // --- Sequences ------------------------------------------------------------------------

  // Creates an empty sequence, or one that starts on a registered prefix (every layer then
  // holds the prefix chain's tokens). No rows are copied and no memory is taken. Its format
  // is the prefix's (INVALID_ARGUMENT naming kv_dtype if another is asked for), or
  // `kv_dtype`, or the store's default.
  absl::Status CreateSequence(absl::string_view sequence_id, absl::string_view prefix_id = "",
                              std::optional<KvDtype> kv_dtype = std::nullopt);

  // Creates `new_id` as a copy of `source_id` that shares its pages; either side's appends
  // never show in the other.
  absl::Status ForkSequence(absl::string_view source_id, absl::string_view new_id);

  // Appends `rows` ([n][dl + dr], rows contiguous, n >= 1) to layer `layer` at token
  // `start_position`. start_position == length appends. Rows over tokens already stored
  // (start_position < length) are compared with them: equal, they are a retry and change
  // nothing, and any rows past the length are appended (a retry may straddle the end); any
  // other row makes the whole append ALREADY_EXISTS naming the first token that differs, and
  // nothing changes. A start past the length is FAILED_PRECONDITION naming the expected
  // position. RESOURCE_EXHAUSTED if the pages do not fit.
  // Into an FP8 sequence the rows are quantised.
  absl::Status Append(absl::string_view sequence_id, int layer, int64_t start_position,
                      TensorView<const Bf16, 2> rows);

  // The same with `n` rows already in the FP8 form (PagePool::WriteFp8Records: content e4m3,
  // fp32 scale, scaled RoPE bf16; Fp8PageLayout::BytesPerToken bytes each, back to back), for
  // an FP8 sequence only (FAILED_PRECONDITION otherwise). INVALID_ARGUMENT naming the row and
  // what is wrong for a scale that is not finite and positive, a NaN content code or a
  // RoPE value that is not finite; nothing is written then.
  absl::Status AppendFp8(absl::string_view sequence_id, int layer, int64_t start_position,
                         std::span<const std::byte> records, int64_t n);

  // Frees the sequence's pages (those a snapshot still reads stay until it is gone).
  absl::Status ReleaseSequence(absl::string_view sequence_id);

  absl::StatusOr<SequenceInfo> GetSequence(absl::string_view sequence_id) const;

  // The sequences in `range`, only those started on prefix `on_prefix_id` when it is not
  // empty. Linear in the sequences held.
  ListPage<SequenceListing> ListSequences(const ListRange& range,
                                          absl::string_view on_prefix_id = "") const;

  // --- Decode ---------------------------------------------------------------------------

  // Pins layer `layer` of the given sequences (a batch; duplicates allowed) as they are now.
  absl::StatusOr<KvSnapshot> Snapshot(std::span<const std::string> sequence_ids, int layer);
  absl::StatusOr<KvSnapshot> Snapshot(absl::string_view sequence_id, int layer);

  // The naive-form K/V of the tokens prefix `prefix` adds to its parent, for one layer,
  // expanded with `weights` on first use and kept (counted in the budget, evictable when no
  // handle pins it) for later calls. The store keeps one expansion per (prefix, layer): pass
  // the same model's weights every time. A concurrent call for the same entry waits for the
  // first to finish. NOT_FOUND for an unknown or freed prefix, INVALID_ARGUMENT for weights
  // of another shape, RESOURCE_EXHAUSTED if the expansion does not fit.
  absl::StatusOr<ExpandedKv> GetOrBuildExpanded(PrefixKey prefix, int layer,
                                                const ModelWeights& weights);

  KvStoreStats Stats() const;

  // --- Restarts (kv_state.h) ------------------------------------------------------------

  // Everything the store holds, as one consistent picture taken under the lock, its pages
  // pinned while the checkpoint lives (so read them soon: pinned pages count in the budget).
  // Registrations and appends still in flight are left out: their callers have no answer
  // yet and retry.
  KvCheckpoint Checkpoint();

  // Loads a saved state into this store, which must hold nothing (FAILED_PRECONDITION).
  // INVALID_ARGUMENT naming the part for a manifest of another model or page size, or one
  // that does not hold together (a page list that does not cover its length, an index out of
  // range, an id twice, a sequence whose pages do not start with its prefix's);
  // RESOURCE_EXHAUSTED if it does not fit the budget; `read_page`'s error if a page cannot be
  // read. On any error the store is left as empty as it was.
  absl::Status Restore(const KvStateManifest& manifest, KvStatePageReader read_page);

 private:
  friend class KvSnapshot;
  friend class ExpandedKv;
  friend class KvCheckpoint;

  struct Sequence;
  struct AppendReservation;
  struct RegisterReservation;

  KvStore(const ModelConfig& model, const KvStoreOptions& options, PagePool pool);

  // Called by KvSnapshot / ExpandedKv when they go.
  void ReleaseSnapshot(std::span<const SequenceSnapshot> sequences,
                       std::span<const PrefixKey> prefixes) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseExpanded(PrefixKey prefix, int layer) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseCheckpoint(std::span<const int32_t> pages) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status CheckLayer(int layer) const;

  // Phases of the operations that copy rows outside the lock.
  // nullopt: the rows are already there (a retry).
  // `fp8_records`: the append brings FP8 records (the sequence must be FP8).
  // `first_difference(dtype, pages, token, row0, n)`: which of the append's rows [row0,
  // row0 + n), stored from `token` on in `pages` of a `dtype` sequence, holds other bytes
  // than the append brings (its index among the append's rows), or nullopt; called under the
  // lock, only for a retry.
  using StoredRowsCheck = absl::FunctionRef<std::optional<int64_t>(
      KvDtype dtype, std::span<const int32_t> pages, int64_t token, int64_t row0, int64_t n)>;
  absl::StatusOr<std::optional<AppendReservation>> ReserveAppend(absl::string_view sequence_id,
                                                                 int layer, int64_t start_position,
                                                                 int64_t rows, bool fp8_records,
                                                                 StoredRowsCheck first_difference)
      ABSL_LOCKS_EXCLUDED(mu_);
  void PublishAppend(const AppendReservation& reservation) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<RegisterReservation> ReserveRegister(absl::string_view prefix_id,
                                                      absl::string_view parent_id,
                                                      TensorView<const Bf16, 3> latent,
                                                      std::optional<KvDtype> kv_dtype)
      ABSL_LOCKS_EXCLUDED(mu_);
  void PublishRegister(const RegisterReservation& reservation) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an existing registration holds exactly `latent` (read without the lock: the
  // reservation references the prefix, whose pages never change while it lives).
  bool SameRows(const RegisterReservation& existing, TensorView<const Bf16, 3> latent) const;

  // True while `sequence` has an append in flight on any layer.
  static bool Appending(const Sequence& sequence);

  // Makes `bytes` more fit in the budget (and in `account`'s quota, for latent pages charged
  // to a tenant), evicting if it must; RESOURCE_EXHAUSTED and no change otherwise.
  absl::Status Reserve(int64_t bytes, absl::string_view what, int32_t account = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The page account of the namespace `id` lives in (0: none), made on first use.
  int32_t AccountOf(absl::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t UsedBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drops a reference (or the registration) and frees the node if it is then dead.
  void DropReference(PrefixNode* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unregister(PrefixNode* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a dead node's pages and expansions, erases it, and drops its parent's reference.
  void FreeNode(PrefixNode* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ModelConfig model_;
  const int64_t budget_bytes_;
  const KvDtype default_kv_dtype_;
  // Immutable mapping; which rows are written when is the protocol described above.
  const PagePool pool_;
  const std::shared_ptr<ExpansionBuilder> expansions_;  // null: expansions on the host

  // Taken through TsanVisibleLock (tsan_visible_lock.h), never absl::MutexLock.
  mutable absl::Mutex mu_;
  // Signalled whenever an operation in flight (append, registration, expansion) publishes.
  mutable absl::CondVar published_;
  PageAllocator pages_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> sequences_ ABSL_GUARDED_BY(mu_);
  PrefixTree tree_ ABSL_GUARDED_BY(mu_);
  ExpandedKvCache expanded_ ABSL_GUARDED_BY(mu_);
  // Tenants' namespaces as page accounts (index 0: no namespace) and their quotas.
  const std::map<std::string, int64_t> namespace_budgets_;
  absl::flat_hash_map<std::string, int32_t> accounts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> account_names_ ABSL_GUARDED_BY(mu_){""};
  int64_t prefix_evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expanded_evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_STORE_H_
