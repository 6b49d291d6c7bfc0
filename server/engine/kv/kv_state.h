#ifndef MLASERVE_SERVER_ENGINE_KV_KV_STATE_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_STATE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kernels/core/kv_dtype.h"

namespace mlaserve::engine {

// What a restart must bring back of a KV store, as plain values (docs/deploy.md, "Restarts
// keep the cache"): every prefix (registered, or released but still referenced), every
// sequence with its origin (so a retried create or fork is still recognised), and the pages
// they hold, each page once however many lists share it, so sharing survives the restart.
// Expanded K/V is not part of it: it is rebuilt on first use.
//
// A page's contents travel as records, one per token: a bf16 page's rows as they are
// (row_width bf16), an FP8 page's as the AppendKv FP8 record (dl e4m3, fp32 scale, dr bf16),
// so the file does not depend on how a page lays its sections out.
struct KvStateManifest {
  // The store it came from must match the one it is loaded into.
  int32_t layers = 0;
  int32_t dl = 0;
  int32_t dr = 0;
  int32_t page_size = 0;  // tokens per bf16 page

  struct Page {
    KvDtype kv_dtype = KvDtype::kBf16;
    int32_t tokens = 0;  // records saved: the most any list holding the page reads of it
  };
  struct Prefix {
    std::string id;
    std::string parent_id;
    int32_t parent = -1;  // index in `prefixes` (always before this one), or -1
    int32_t begin = 0;
    int32_t end = 0;
    KvDtype kv_dtype = KvDtype::kBf16;
    bool registered = true;                   // false: released, alive through references
    std::vector<std::vector<int32_t>> pages;  // [layer] indices in `pages`
  };
  struct Sequence {
    std::string id;
    bool forked = false;
    std::string origin_id;  // the prefix id it was created on, or its fork source
    int32_t prefix = -1;    // index in `prefixes`, or -1
    KvDtype kv_dtype = KvDtype::kBf16;
    std::vector<int32_t> lengths;             // [layer]
    std::vector<std::vector<int32_t>> pages;  // [layer] indices in `pages`
  };

  std::vector<Page> pages;
  std::vector<Prefix> prefixes;
  std::vector<Sequence> sequences;

  int64_t tokens() const;  // records over all pages
};

// Bytes of one record (one token of a page).
int64_t KvStateRecordBytes(KvDtype kv_dtype, int dl, int dr);

// Whether `manifest` holds together for a store of the same geometry whose pages hold
// `bf16_page_tokens` / `fp8_page_tokens` tokens: INVALID_ARGUMENT naming the first part that
// does not (another model or page size, an index out of range, a page list that does not
// cover its length, an id that is no valid id or is there twice, a sequence whose page lists
// do not start with its prefix's full pages, a page nobody holds, a released prefix nobody
// references). Everything KvStore::Restore relies on, so a manifest that passes cannot
// corrupt the store.
absl::Status CheckKvStateManifest(const KvStateManifest& manifest, int layers, int dl, int dr,
                                  int bf16_page_tokens, int fp8_page_tokens);

// Fills `out` (tokens * record bytes) with page `index`'s records; an error ends a restore.
// Called once per page, in index order, so a reader may stream from a file.
using KvStatePageReader = absl::FunctionRef<absl::Status(int32_t index, std::span<std::byte> out)>;

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_STATE_H_
