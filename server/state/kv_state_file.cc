#include "server/state/kv_state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "mlaserve/v1/kv_state.pb.h"

namespace mlaserve::state {
namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'K', 'V', 'S', 'T', '\0'};
constexpr uint32_t kVersion = 1;
// magic, version, reserved, manifest length
constexpr int64_t kHeaderBytes = 8 + 4 + 4 + 8;
constexpr int64_t kChecksumBytes = 4;
// Pages are streamed in runs of about this size, so neither side holds the state twice.
constexpr size_t kIoChunk = size_t{4} << 20;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

v1::KvDtype ToWire(KvDtype dtype) {
  return dtype == KvDtype::kFp8 ? v1::KV_DTYPE_FP8 : v1::KV_DTYPE_BF16;
}
// Unknown codes become a value CheckKvStateManifest rejects.
KvDtype FromWire(v1::KvDtype dtype) {
  switch (dtype) {
    case v1::KV_DTYPE_BF16:
      return KvDtype::kBf16;
    case v1::KV_DTYPE_FP8:
      return KvDtype::kFp8;
    default:
      return static_cast<KvDtype>(-1);
  }
}

void ToProto(const std::vector<std::vector<int32_t>>& lists,
             google::protobuf::RepeatedPtrField<v1::KvStatePageList>* out) {
  for (const std::vector<int32_t>& list : lists) {
    out->Add()->mutable_pages()->Add(list.begin(), list.end());
  }
}
std::vector<std::vector<int32_t>> FromProto(
    const google::protobuf::RepeatedPtrField<v1::KvStatePageList>& lists) {
  std::vector<std::vector<int32_t>> out;
  for (const v1::KvStatePageList& list : lists)
    out.emplace_back(list.pages().begin(), list.pages().end());
  return out;
}

v1::KvStateManifest ToProto(const engine::KvStateManifest& m) {
  v1::KvStateManifest p;
  p.set_layers(m.layers);
  p.set_dl(m.dl);
  p.set_dr(m.dr);
  p.set_page_size(m.page_size);
  for (const engine::KvStateManifest::Page& page : m.pages) {
    v1::KvStatePage* out = p.add_pages();
    out->set_kv_dtype(ToWire(page.kv_dtype));
    out->set_tokens(page.tokens);
  }
  for (const engine::KvStateManifest::Prefix& prefix : m.prefixes) {
    v1::KvStatePrefix* out = p.add_prefixes();
    out->set_id(prefix.id);
    out->set_parent_id(prefix.parent_id);
    out->set_parent(prefix.parent);
    out->set_begin(prefix.begin);
    out->set_end(prefix.end);
    out->set_kv_dtype(ToWire(prefix.kv_dtype));
    out->set_registered(prefix.registered);
    ToProto(prefix.pages, out->mutable_layers());
  }
  for (const engine::KvStateManifest::Sequence& sequence : m.sequences) {
    v1::KvStateSequence* out = p.add_sequences();
    out->set_id(sequence.id);
    out->set_forked(sequence.forked);
    out->set_origin_id(sequence.origin_id);
    out->set_prefix(sequence.prefix);
    out->set_kv_dtype(ToWire(sequence.kv_dtype));
    out->mutable_lengths()->Add(sequence.lengths.begin(), sequence.lengths.end());
    ToProto(sequence.pages, out->mutable_layers());
  }
  return p;
}

engine::KvStateManifest FromProto(const v1::KvStateManifest& p) {
  engine::KvStateManifest m;
  m.layers = p.layers();
  m.dl = p.dl();
  m.dr = p.dr();
  m.page_size = p.page_size();
  for (const v1::KvStatePage& page : p.pages()) {
    m.pages.push_back({FromWire(page.kv_dtype()), page.tokens()});
  }
  for (const v1::KvStatePrefix& in : p.prefixes()) {
    engine::KvStateManifest::Prefix prefix;
    prefix.id = in.id();
    prefix.parent_id = in.parent_id();
    prefix.parent = in.parent();
    prefix.begin = in.begin();
    prefix.end = in.end();
    prefix.kv_dtype = FromWire(in.kv_dtype());
    prefix.registered = in.registered();
    prefix.pages = FromProto(in.layers());
    m.prefixes.push_back(std::move(prefix));
  }
  for (const v1::KvStateSequence& in : p.sequences()) {
    engine::KvStateManifest::Sequence sequence;
    sequence.id = in.id();
    sequence.forked = in.forked();
    sequence.origin_id = in.origin_id();
    sequence.prefix = in.prefix();
    sequence.kv_dtype = FromWire(in.kv_dtype());
    sequence.lengths.assign(in.lengths().begin(), in.lengths().end());
    sequence.pages = FromProto(in.layers());
    m.sequences.push_back(std::move(sequence));
  }
  return m;
}

template <typename T>
void PutLittleEndian(std::vector<std::byte>& out, T value) {
  static_assert(std::endian::native == std::endian::little, "the file is little-endian");
  const auto* bytes = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof value);
}

template <typename T>
T GetLittleEndian(const std::byte* in) {
  T value;
  std::memcpy(&value, in, sizeof value);
  return value;
}

uLong Crc(uLong crc, std::span<const std::byte> bytes) {
  return crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
}

// Writes `bytes` and folds them into `crc`.
absl::Status Put(std::FILE* file, std::span<const std::byte> bytes, uLong& crc,
                 const std::string& path) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) return Errno("write", path);
  crc = Crc(crc, bytes);
  return absl::OkStatus();
}

absl::Status SyncDirectoryOf(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory of", path);
  const int synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0) return Errno("fsync directory of", path);
  return absl::OkStatus();
}

absl::Status WriteTemporary(const std::string& tmp, const std::string& manifest_bytes,
                            const engine::KvCheckpoint& checkpoint) {
  File file(std::fopen(tmp.c_str(), "wbe"));
  if (file == nullptr) return Errno("create", tmp);
  uLong crc = crc32_z(0, nullptr, 0);
  std::vector<std::byte> header;
  header.insert(header.end(), reinterpret_cast<const std::byte*>(kMagic),
                reinterpret_cast<const std::byte*>(kMagic) + sizeof kMagic);
  PutLittleEndian<uint32_t>(header, kVersion);
  PutLittleEndian<uint32_t>(header, 0);
  PutLittleEndian<uint64_t>(header, manifest_bytes.size());
  RETURN_IF_ERROR(Put(file.get(), header, crc, tmp));
  RETURN_IF_ERROR(Put(file.get(), std::as_bytes(std::span(manifest_bytes)), crc, tmp));
  const engine::KvStateManifest& m = checkpoint.manifest();
  std::vector<std::byte> buffer;
  for (size_t i = 0; i < m.pages.size(); ++i) {
    const int64_t bytes =
        m.pages[i].tokens * engine::KvStateRecordBytes(m.pages[i].kv_dtype, m.dl, m.dr);
    buffer.resize(static_cast<size_t>(bytes));
    checkpoint.ReadPage(static_cast<int32_t>(i), buffer);
    RETURN_IF_ERROR(Put(file.get(), buffer, crc, tmp));
  }
  std::vector<std::byte> trailer;
  PutLittleEndian<uint32_t>(trailer, static_cast<uint32_t>(crc));
  if (std::fwrite(trailer.data(), 1, trailer.size(), file.get()) != trailer.size()) {
    return Errno("write", tmp);
  }
  if (std::fflush(file.get()) != 0) return Errno("write", tmp);
  if (::fsync(::fileno(file.get())) != 0) return Errno("fsync", tmp);
  if (std::fclose(file.release()) != 0) return Errno("close", tmp);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvStateFileInfo> WriteKvStateFile(const std::string& path,
                                                 const engine::KvCheckpoint& checkpoint,
                                                 const std::string& instance_id,
                                                 const std::string& model_name) {
  const engine::KvStateManifest& m = checkpoint.manifest();
  v1::KvStateManifest manifest = ToProto(m);
  const absl::Time now = absl::Now();
  manifest.set_instance_id(instance_id);
  manifest.set_server_version(MLASERVE_VERSION);
  manifest.set_written_unix_s(absl::ToUnixSeconds(now));
  manifest.set_model(model_name);
  std::string manifest_bytes;
  if (!manifest.SerializeToString(&manifest_bytes)) {
    return absl::InternalError(absl::StrCat("cannot serialize the KV state manifest for ", path));
  }
  const std::string tmp = path + ".tmp";
  if (absl::Status written = WriteTemporary(tmp, manifest_bytes, checkpoint); !written.ok()) {
    std::remove(tmp.c_str());
    return written;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status renamed = Errno(absl::StrCat("rename ", tmp, " to"), path);
    std::remove(tmp.c_str());
    return renamed;
  }
  RETURN_IF_ERROR(SyncDirectoryOf(path));
  KvStateFileInfo info;
  info.instance_id = instance_id;
  info.server_version = MLASERVE_VERSION;
  info.written = now;
  info.prefixes = static_cast<int64_t>(m.prefixes.size());
  info.sequences = static_cast<int64_t>(m.sequences.size());
  info.pages = static_cast<int64_t>(m.pages.size());
  info.tokens = m.tokens();
  std::error_code error;
  info.bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  return info;
}

absl::StatusOr<KvStateFileInfo> LoadKvStateFile(const std::string& path, engine::Engine& engine) {
  File file(std::fopen(path.c_str(), "rbe"));
  if (file == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no KV state file ", path));
    return Errno("open", path);
  }
  struct stat st {};
  if (::fstat(::fileno(file.get()), &st) != 0) return Errno("stat", path);
  const int64_t size = st.st_size;
  auto data_loss = [&path, size](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("KV state file ", path, " (", size, " bytes) ", what));
  };
  if (size < kHeaderBytes + kChecksumBytes) return data_loss("is shorter than its header");

  // Pass 1: the checksum over the whole file, before anything is believed.
  std::vector<std::byte> buffer(kIoChunk);
  uLong crc = crc32_z(0, nullptr, 0);
  for (int64_t left = size - kChecksumBytes; left > 0;) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(left, kIoChunk));
    if (std::fread(buffer.data(), 1, want, file.get()) != want) return data_loss("ends early");
    crc = Crc(crc, std::span(buffer.data(), want));
    left -= static_cast<int64_t>(want);
  }
  std::byte trailer[kChecksumBytes];
  if (std::fread(trailer, 1, sizeof trailer, file.get()) != sizeof trailer) {
    return data_loss("ends early");
  }
  if (GetLittleEndian<uint32_t>(trailer) != static_cast<uint32_t>(crc)) {
    return data_loss("fails its checksum (corrupt or partly written)");
  }

  // Pass 2: header, manifest, pages.
  std::rewind(file.get());
  std::byte header[kHeaderBytes];
  if (std::fread(header, 1, sizeof header, file.get()) != sizeof header) {
    return data_loss("ends early");
  }
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0) return data_loss("is no KV state file");
  if (const uint32_t version = GetLittleEndian<uint32_t>(header + 8); version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat("KV state file ", path,
                                                      " is of format version ", version,
                                                      "; this server reads version ", kVersion));
  }
  const auto manifest_bytes = GetLittleEndian<uint64_t>(header + 16);
  if (manifest_bytes > static_cast<uint64_t>(size - kHeaderBytes - kChecksumBytes)) {
    return data_loss("has a manifest longer than the file");
  }
  std::string manifest_data(manifest_bytes, '\0');
  if (std::fread(manifest_data.data(), 1, manifest_data.size(), file.get()) !=
      manifest_data.size()) {
    return data_loss("ends early");
  }
  v1::KvStateManifest manifest;
  if (!manifest.ParseFromString(manifest_data))
    return data_loss("has a manifest that does not parse");
  const engine::KvStateManifest m = FromProto(manifest);
  // The pages must fill the file exactly; checked before loading so a short page section is
  // DATA_LOSS, not a half-read store.
  int64_t page_bytes = 0;
  for (const engine::KvStateManifest::Page& page : m.pages) {
    if (page.tokens < 0 || page.tokens > (int64_t{1} << 24))
      return data_loss("has a bad page size");
    page_bytes += page.tokens *
                  engine::KvStateRecordBytes(page.kv_dtype, std::max(m.dl, 0), std::max(m.dr, 0));
  }
  if (page_bytes != size - kHeaderBytes - static_cast<int64_t>(manifest_bytes) - kChecksumBytes) {
    return data_loss("holds other page bytes than its manifest lists");
  }
  RETURN_IF_ERROR(engine.RestoreKv(m, [&](int32_t, std::span<std::byte> out) -> absl::Status {
    if (std::fread(out.data(), 1, out.size(), file.get()) != out.size()) {
      return data_loss("ends early");
    }
    return absl::OkStatus();
  }));
  KvStateFileInfo info;
  info.instance_id = manifest.instance_id();
  info.server_version = manifest.server_version();
  info.written = absl::FromUnixSeconds(manifest.written_unix_s());
  info.prefixes = static_cast<int64_t>(m.prefixes.size());
  info.sequences = static_cast<int64_t>(m.sequences.size());
  info.pages = static_cast<int64_t>(m.pages.size());
  info.tokens = m.tokens();
  info.bytes = size;
  return info;
}

}  // namespace mlaserve::state
