#include "server/engine/model/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::engine {
namespace {

using ::testing::HasSubstr;
using Tensors = std::vector<SafetensorsTensor>;

std::string ScratchFile(absl::string_view name) {
  static const ::mlaserve::testing::ScratchDir dir("safetensors_test");
  return dir.Path(std::string(name));
}

// A file built byte by byte, for the malformed cases the writer refuses to produce.
std::string WriteRaw(absl::string_view name, const std::string& header, size_t data_bytes,
                     uint64_t header_length) {
  const std::string path = ScratchFile(name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_length), sizeof(header_length));
  out << header << std::string(data_bytes, '\x01');
  return path;
}

std::string WriteRaw(absl::string_view name, const std::string& header, size_t data_bytes) {
  return WriteRaw(name, header, data_bytes, header.size());
}

absl::Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

TEST(SafetensorsTest, RoundTripsTensorsOfSeveralDtypes) {
  const std::vector<uint16_t> bf16 = {0x3f80, 0x4000, 0xbf80, 0x0000, 0x7f80, 0x3c00};
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0e-8f, 65504.0f};
  const std::vector<int32_t> scalar = {42};
  const std::vector<SafetensorsTensor> tensors = {
      {"a.bf16", "BF16", {2, 3}, Bytes(bf16)},
      {"b.f32", "F32", {4}, Bytes(f32)},
      {"c.scalar", "I32", {}, Bytes(scalar)},
  };
  const std::string path = ScratchFile("round_trip");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  const absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors().size(), 3u);  // __metadata__ is not a tensor
  for (const SafetensorsTensor& t : tensors) {
    const SafetensorsTensorInfo* info = file->Find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    const std::span<const std::byte> data = file->Data(*info);
    ASSERT_EQ(data.size(), t.data.size());
    EXPECT_EQ(std::memcmp(data.data(), t.data.data(), data.size()), 0) << t.name;
  }
  EXPECT_EQ(file->Find("missing"), nullptr);
}

TEST(SafetensorsTest, WriterAlignsTheDataSectionToEightBytes) {
  const std::vector<uint8_t> one = {7};
  const std::string path = ScratchFile("aligned");
  ASSERT_TRUE(WriteSafetensors(path, Tensors{{"x", "U8", {1}, Bytes(one)}}).ok());
  std::ifstream in(path, std::ios::binary);
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), sizeof(header_length));
  EXPECT_EQ(header_length % 8, 0u);
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(OpenStatus(ScratchFile("does_not_exist")).code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, RejectsFileShorterThanTheHeaderLength) {
  const std::string path = ScratchFile("tiny");
  std::ofstream(path, std::ios::binary) << "abcde";
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("too short"));
}

TEST(SafetensorsTest, RejectsTruncatedHeader) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const absl::Status s = OpenStatus(WriteRaw("truncated_header", header, 2, header.size() + 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST(SafetensorsTest, RejectsAbsurdHeaderLength) {
  const absl::Status s = OpenStatus(WriteRaw("huge_header", "{}", 0, uint64_t{1} << 40));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("limit"));
}

TEST(SafetensorsTest, RejectsBadJson) {
  const absl::Status s = OpenStatus(WriteRaw("bad_json", R"({"t": {"dtype": )", 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(OpenStatus(WriteRaw("json_array", "[1, 2]", 0)).message(),
              HasSubstr("not a JSON object"));
}

TEST(SafetensorsTest, RejectsMalformedEntriesNamingTensorAndField) {
  struct Case {
    const char* header;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"t":{"shape":[2],"data_offsets":[0,2]}})", "'dtype'"},
      {R"({"t":{"dtype":"U8","data_offsets":[0,2]}})", "'shape'"},
      {R"({"t":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "'shape'"},
      {R"({"t":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", "'shape'"},
      {R"({"t":{"dtype":"U8","shape":[2]}})", "'data_offsets'"},
      {R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", "'data_offsets'"},
      {R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "'data_offsets'"},
      {R"({"t":[1,2]})", "not a JSON object"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const absl::Status s = OpenStatus(WriteRaw(absl::StrCat("entry", i++), c.header, 2));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_THAT(s.message(), HasSubstr("tensor 't'")) << c.header;
    EXPECT_THAT(s.message(), HasSubstr(c.expected)) << c.header;
  }
}

TEST(SafetensorsTest, RejectsOffsetsPastTheData) {
  const absl::Status s = OpenStatus(
      WriteRaw("past_end", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("reach past the data section"));
}

TEST(SafetensorsTest, RejectsByteSizeThatIsNotShapeTimesDtype) {
  const absl::Status s =
      OpenStatus(WriteRaw("size", R"({"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs 6 bytes"));
}

TEST(SafetensorsTest, RejectsOverlapsAndHoles) {
  const absl::Status overlap =
      OpenStatus(WriteRaw("overlap",
                          R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                          6));
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overlap.message(), HasSubstr("overlaps"));

  const absl::Status hole =
      OpenStatus(WriteRaw("hole",
                          R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                          6));
  EXPECT_EQ(hole.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hole.message(), HasSubstr("belong to no tensor"));

  const absl::Status trailing = OpenStatus(
      WriteRaw("trailing", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 4));
  EXPECT_EQ(trailing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(trailing.message(), HasSubstr("end at byte 2"));
}

TEST(SafetensorsTest, IgnoresMetadataAndToleratesUnknownDtypes) {
  const absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(WriteRaw("lenient",
                                     R"({"__metadata__":{"format":"pt","anything":"goes"},)"
                                     R"("future":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})",
                                     2));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_NE(file->Find("future"), nullptr);
  EXPECT_EQ(file->Find("future")->dtype, "F4");
  EXPECT_EQ(file->Find("__metadata__"), nullptr);
}

TEST(SafetensorsTest, WriterRejectsInconsistentTensors) {
  const std::vector<uint16_t> two = {1, 2};
  const std::string path = ScratchFile("writer_rejects");
  EXPECT_THAT(WriteSafetensors(path, Tensors{{"x", "BF16", {3}, Bytes(two)}}).message(),
              HasSubstr("does not match"));
  EXPECT_THAT(WriteSafetensors(path, Tensors{{"x", "Q7", {2}, Bytes(two)}}).message(),
              HasSubstr("unknown dtype"));
  EXPECT_THAT(WriteSafetensors(
                  path, Tensors{{"x", "BF16", {2}, Bytes(two)}, {"x", "BF16", {2}, Bytes(two)}})
                  .message(),
              HasSubstr("twice"));
  EXPECT_THAT(WriteSafetensors(path, Tensors{{"__metadata__", "BF16", {2}, Bytes(two)}}).message(),
              HasSubstr("reserved"));
}

}  // namespace
}  // namespace mlaserve::engine
