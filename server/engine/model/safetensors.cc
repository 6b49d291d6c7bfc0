#include "server/engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mlaserve::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; this reader copies bytes as they are");

// The reference implementation's cap: a header this large is an attack, not a model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr absl::string_view kMetadataKey = "__metadata__";

absl::Status Malformed(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": ", what));
}

// A JSON value that is a non-negative integer fitting int64.
std::optional<int64_t> AsIndex(const nlohmann::json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  const uint64_t v = value.get<uint64_t>();
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(v);
}

// product(shape) * element_bytes, or nullopt on int64 overflow.
std::optional<int64_t> ByteSize(std::span<const int64_t> shape, int64_t element_bytes) {
  int64_t bytes = element_bytes;
  for (int64_t d : shape) {
    if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d) return std::nullopt;
    bytes *= d;
  }
  return bytes;
}

absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(absl::string_view path,
                                                       absl::string_view name,
                                                       const nlohmann::json& entry,
                                                       int64_t data_bytes) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!entry.is_object()) return Malformed(path, absl::StrCat(where, " is not a JSON object"));
  SafetensorsTensorInfo info;

  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return Malformed(path, absl::StrCat(where, ": 'dtype' is missing or not a string"));
  }
  info.dtype = dtype->get<std::string>();

  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return Malformed(path, absl::StrCat(where, ": 'shape' is missing or not an array"));
  }
  for (const nlohmann::json& d : *shape) {
    const std::optional<int64_t> dim = AsIndex(d);
    if (!dim.has_value()) {
      return Malformed(
          path, absl::StrCat(where, ": 'shape' holds ", d.dump(), ", not a non-negative integer"));
    }
    info.shape.push_back(*dim);
  }

  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
    return Malformed(path, absl::StrCat(where, ": 'data_offsets' is missing or not [begin, end]"));
  }
  const std::optional<int64_t> begin = AsIndex((*offsets)[0]);
  const std::optional<int64_t> end = AsIndex((*offsets)[1]);
  if (!begin.has_value() || !end.has_value() || *begin > *end) {
    return Malformed(path, absl::StrCat(where, ": 'data_offsets' ", offsets->dump(),
                                        " is not a byte range [begin <= end]"));
  }
  if (*end > data_bytes) {
    return Malformed(path, absl::StrCat(where, ": 'data_offsets' ", offsets->dump(),
                                        " reach past the data section (", data_bytes,
                                        " bytes): the file is truncated or the header is wrong"));
  }
  info.begin = *begin;
  info.end = *end;

  // A dtype we do not know cannot be size-checked; it only matters if someone reads it.
  if (const std::optional<int> element = SafetensorsDtypeSize(info.dtype); element.has_value()) {
    const std::optional<int64_t> expected = ByteSize(info.shape, *element);
    if (!expected.has_value() || *expected != info.end - info.begin) {
      return Malformed(
          path,
          absl::StrCat(where, ": shape [", absl::StrJoin(info.shape, ", "), "] of ", info.dtype,
                       " needs ", expected.has_value() ? absl::StrCat(*expected) : "> 2^63",
                       " bytes but 'data_offsets' span ", info.end - info.begin));
    }
  }
  return info;
}

// The format's tiling rule: sorted by offset, each tensor starts where the previous ended,
// the first at 0 and the last at the end of the data section.
absl::Status CheckTiling(absl::string_view path,
                         const absl::flat_hash_map<std::string, SafetensorsTensorInfo>& tensors,
                         int64_t data_bytes) {
  std::vector<std::pair<const std::string*, const SafetensorsTensorInfo*>> sorted;
  sorted.reserve(tensors.size());
  for (const auto& [name, info] : tensors) sorted.emplace_back(&name, &info);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end, *a.first) <
           std::tie(b.second->begin, b.second->end, *b.first);
  });
  int64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, info] : sorted) {
    if (info->begin < covered) {
      return Malformed(path, absl::StrCat("tensor '", *name, "' (bytes ", info->begin, "..",
                                          info->end, ") overlaps tensor '", *previous, "'"));
    }
    if (info->begin > covered) {
      return Malformed(path, absl::StrCat("bytes ", covered, "..", info->begin,
                                          " of the data section belong to no tensor"));
    }
    covered = info->end;
    previous = name;
  }
  if (covered != data_bytes) {
    return Malformed(path, absl::StrCat("the data section has ", data_bytes,
                                        " bytes but its tensors end at byte ", covered));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int> SafetensorsDtypeSize(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},
  };
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return std::nullopt;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("safetensors ", path, ": cannot open"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat("safetensors ", path, ": cannot stat"));
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    return Malformed(path, absl::StrCat("file is ", file_bytes,
                                        " bytes, too short for the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);  // the mapping keeps the file open
  if (mapping == MAP_FAILED) {
    return absl::ErrnoToStatus(map_error, absl::StrCat("safetensors ", path, ": cannot mmap"));
  }

  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = mapping;
  file.mapping_bytes_ = file_bytes;
  const auto* bytes = static_cast<const std::byte*>(mapping);

  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes, sizeof(header_bytes));
  if (header_bytes > kMaxHeaderBytes) {
    return Malformed(path, absl::StrCat("header length ", header_bytes, " exceeds the ",
                                        kMaxHeaderBytes, "-byte limit"));
  }
  if (header_bytes > file_bytes - 8) {
    return Malformed(path, absl::StrCat("header length ", header_bytes, " exceeds the ",
                                        file_bytes - 8, " bytes after it: the file is truncated"));
  }
  const auto* header = reinterpret_cast<const char*>(bytes + 8);
  const nlohmann::json json = nlohmann::json::parse(header, header + header_bytes,
                                                    /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Malformed(path, "the header is not valid JSON");
  if (!json.is_object()) return Malformed(path, "the header is not a JSON object");

  const auto data_bytes = static_cast<int64_t>(file_bytes - 8 - header_bytes);
  file.data_section_ = bytes + 8 + header_bytes;
  for (const auto& [name, entry] : json.items()) {
    if (name == kMetadataKey) continue;  // free-form strings; nothing here depends on them
    ASSIGN_OR_RETURN(SafetensorsTensorInfo info, ParseTensorEntry(path, name, entry, data_bytes));
    file.tensors_.emplace(name, std::move(info));
  }
  RETURN_IF_ERROR(CheckTiling(path, file.tensors_, data_bytes));
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      data_section_(std::exchange(other.data_section_, nullptr)),
      tensors_(std::move(other.tensors_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    data_section_ = std::exchange(other.data_section_, nullptr);
    tensors_ = std::move(other.tensors_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

const SafetensorsTensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::span<const std::byte> SafetensorsFile::Data(const SafetensorsTensorInfo& tensor) const {
  return {data_section_ + tensor.begin, static_cast<std::size_t>(tensor.end - tensor.begin)};
}

absl::Status WriteSafetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  absl::flat_hash_set<absl::string_view> names;
  int64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors ", path, ": tensor name '", t.name, "' is reserved or empty"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors ", path, ": tensor '", t.name, "' is given twice"));
    }
    const std::optional<int> element = SafetensorsDtypeSize(t.dtype);
    if (!element.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": tensor '", t.name,
                                                     "' has unknown dtype '", t.dtype, "'"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors ", path, ": tensor '", t.name, "' has a negative dimension"));
      }
    }
    const std::optional<int64_t> bytes = ByteSize(t.shape, *element);
    if (!bytes.has_value() || *bytes != static_cast<int64_t>(t.data.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors ", path, ": tensor '", t.name, "' shape [", absl::StrJoin(t.shape, ", "),
          "] of ", t.dtype, " does not match its ", t.data.size(), " bytes of data"));
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }
  // Tensor names are arbitrary bytes to us; never let the JSON writer throw on bad UTF-8.
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.resize((text.size() + 7) / 8 * 8, ' ');  // data section 8-byte aligned
  const uint64_t header_bytes = text.size();

  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("safetensors ", path, ": cannot create"));
  }
  bool ok = std::fwrite(&header_bytes, sizeof(header_bytes), 1, out) == 1 &&
            std::fwrite(text.data(), 1, text.size(), out) == text.size();
  for (const SafetensorsTensor& t : tensors) {
    if (!ok) break;
    if (!t.data.empty()) ok = std::fwrite(t.data.data(), 1, t.data.size(), out) == t.data.size();
  }
  const int write_error = errno;
  if (std::fclose(out) != 0 && ok) {
    return absl::ErrnoToStatus(errno, absl::StrCat("safetensors ", path, ": cannot close"));
  }
  if (!ok)
    return absl::ErrnoToStatus(write_error, absl::StrCat("safetensors ", path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace mlaserve::engine
