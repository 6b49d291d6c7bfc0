#ifndef MLASERVE_SERVER_ENGINE_KV_PAGE_WRITE_LOG_H_
#define MLASERVE_SERVER_ENGINE_KV_PAGE_WRITE_LOG_H_

#include <cstdint>
#include <mutex>
#include <vector>

namespace mlaserve::engine {

// Told of every write into a page pool, after the bytes are in place: bytes [begin, end) of
// page `page`'s slot. Called from any thread (appends, registrations and copy-on-write copy
// rows outside the store's lock).
class PageWriteListener {
 public:
  virtual ~PageWriteListener() = default;
  virtual void Written(int32_t page, int64_t begin, int64_t end) = 0;
};

// The byte ranges written since the last Drain, for a device that keeps its own copy of the
// pool (a GPU's page mirror): it uploads exactly these before its next batch reads the pool.
// Ranges are widened to whole multiples of `alignment` bytes (copies move aligned vectors;
// bytes next to a written range are the host's own and harmless to copy again), then merged
// per page. Thread-safe.
class PageWriteLog final : public PageWriteListener {
 public:
  explicit PageWriteLog(int64_t alignment = 16) : alignment_(alignment) {}

  struct Range {
    int32_t page = 0;
    int64_t begin = 0;
    int64_t end = 0;
    friend bool operator==(const Range&, const Range&) = default;
  };

  void Written(int32_t page, int64_t begin, int64_t end) override;
  // What was written since the last call, sorted by page and offset, overlapping and
  // touching ranges merged; the log is empty afterwards.
  std::vector<Range> Drain();
  // Puts ranges back (a batch that took them failed before they reached the device).
  void Restore(const std::vector<Range>& ranges);

 private:
  const int64_t alignment_;
  std::mutex mu_;
  std::vector<Range> pending_;  // guarded by mu_
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_PAGE_WRITE_LOG_H_
