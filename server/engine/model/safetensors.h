#ifndef MLASERVE_SERVER_ENGINE_MODEL_SAFETENSORS_H_
#define MLASERVE_SERVER_ENGINE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve::engine {

// The safetensors format (huggingface/safetensors):
//
//   u64 little-endian N | N bytes of JSON header | data section
//
// The header maps tensor names to {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}
// with byte offsets relative to the data section, plus an optional "__metadata__" object of
// strings. The format requires the tensors to tile the data section exactly: no overlaps
// and no holes (so a file cannot carry a second, hidden payload).

// Bytes per element of a safetensors dtype ("BF16" -> 2), or nullopt for a dtype this code
// does not know (sub-byte and future types).
std::optional<int> SafetensorsDtypeSize(absl::string_view dtype);

// One tensor's header entry.
struct SafetensorsTensorInfo {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte range in the data section
  int64_t end = 0;
};

// A safetensors file mapped read-only. Opening parses and validates the whole header; tensor
// bytes are only paged in when read, so loading a few tensors of a large checkpoint shard
// touches only those.
class SafetensorsFile {
 public:
  // NOT_FOUND if the file does not exist; INVALID_ARGUMENT naming the field for a malformed
  // file (truncated header, bad JSON, offsets outside the data section, overlaps or holes, a
  // byte size that is not shape x dtype size).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const absl::flat_hash_map<std::string, SafetensorsTensorInfo>& tensors() const {
    return tensors_;
  }

  // nullptr if the file has no tensor of that name.
  const SafetensorsTensorInfo* Find(absl::string_view name) const;

  // The tensor's bytes, valid while this object lives. No alignment is guaranteed (the
  // format does not promise any): read multi-byte values with memcpy.
  std::span<const std::byte> Data(const SafetensorsTensorInfo& tensor) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  const std::byte* data_section_ = nullptr;
  absl::flat_hash_map<std::string, SafetensorsTensorInfo> tensors_;
};

// A tensor to write: `data` holds exactly product(shape) x dtype-size bytes, little-endian.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// Writes `tensors` in the given order, header padded with spaces to a multiple of 8 bytes as
// the reference writer does. INVALID_ARGUMENT for an empty, duplicate or reserved name, an
// unknown dtype or a byte size that does not match the shape; the errno status if the file
// cannot be written.
absl::Status WriteSafetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_MODEL_SAFETENSORS_H_
