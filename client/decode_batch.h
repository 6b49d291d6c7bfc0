#ifndef MLASERVE_CLIENT_DECODE_BATCH_H_
#define MLASERVE_CLIENT_DECODE_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mlaserve/v1/decode.pb.h"

namespace mlaserve::client {

// One layer's queries of B sequences as stacked tensors (decode.proto's PackedQueries): what
// a framework's decode loop holds per layer. Tensors are the caller's memory, read while the
// call runs.

// A stacked tensor: `shape`, outermost first, of `dtype` elements at `data` (row-major,
// contiguous, little-endian).
struct BatchTensor {
  v1::DType dtype = v1::DTYPE_BF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  bool present() const { return !shape.empty(); }
  int64_t elements() const;
  size_t bytes() const;
};

struct DecodeBatchRequest {
  std::vector<std::string> sequence_ids;  // B
  int layer = 0;
  // Head space: q_nope [B][sq][heads][dn], q_pe [B][sq][heads][dr], the model's heads from
  // first_head. Latent: latent [B][sq][heads][dl + dr].
  BatchTensor q_nope;
  BatchTensor q_pe;
  int first_head = 0;
  BatchTensor latent;
  // Optional rows [B][n][dl + dr] appended at append_positions [B] before attending.
  BatchTensor append_rows;
  std::vector<int64_t> append_positions;
  v1::DType output_dtype = v1::DTYPE_BF16;
  std::optional<float> softmax_scale;
  // DecodeCallOptions.batch_invariant; unset: the server's default.
  std::optional<bool> batch_invariant;

  bool head_space() const { return !latent.present(); }
  int64_t sequences() const { return static_cast<int64_t>(sequence_ids.size()); }
  // sq and heads: dims 1 and 2 of the query tensors (0 before CheckDecodeBatch passes).
  int64_t sq() const;
  int64_t heads() const;
};

// Where the answers go: the caller's memory, sized exactly for them (a framework's
// preallocated buffers). out [B][sq][heads][width] in output_dtype (width: the model's dv in
// head space, dl in latent space), lse [B][sq][heads]; plans are filled, one per sequence.
struct DecodeBatchOutput {
  std::span<std::byte> out;
  std::span<float> lse;
  std::vector<v1::DecodePlan> plans;
};

// Memory a caller may build a request's tensors and answers in (ServingClient::AllocateArray),
// 64-byte aligned: on the same-host data plane a block of the client's registered region,
// which a call then neither copies in nor out; otherwise ordinary memory. Freed with the last
// copy of `owner`.
struct SharedArray {
  std::span<std::byte> bytes;
  std::shared_ptr<void> owner;
};

// Ordinary memory in SharedArray's form.
SharedArray HeapArray(uint64_t bytes);

// Owned memory for a request's answers, for callers without buffers of their own.
struct DecodeBatchBuffers {
  std::vector<std::byte> out;
  std::vector<float> lse;
  DecodeBatchOutput output;  // views of the two, plans

  // `width`: the model's dv (head space) or dl (latent).
  DecodeBatchBuffers(const DecodeBatchRequest& request, int width);
  DecodeBatchBuffers(const DecodeBatchBuffers&) = delete;
  DecodeBatchBuffers& operator=(const DecodeBatchBuffers&) = delete;
};

// INVALID_ARGUMENT naming the argument whose shape does not fit the batch (the Python
// client's batch form checks the same); the server checks the rest and names the field.
absl::Status CheckDecodeBatch(const DecodeBatchRequest& request);

// Bytes of queries and appended rows of sequences [first, first + count), for splitting a
// batch under a message limit.
size_t BatchBytes(const DecodeBatchRequest& request, int64_t first, int64_t count);

// Where a stacked tensor's bytes for sequences [first, first + count) go once its dtype and
// shape are in `wire`: copied into its data (gRPC), or named by region_offset where the
// caller put them in a registered region (the same-host data plane).
using PlaceTensor = absl::FunctionRef<void(const BatchTensor& tensor, int64_t first, int64_t count,
                                           v1::Tensor* wire)>;
void CopyIntoMessage(const BatchTensor& tensor, int64_t first, int64_t count, v1::Tensor* wire);

// The request for sequences [first, first + count), packed or as a list of queries (for
// servers and clusters that route per query; its bytes are copied into the message).
v1::DecodeRequest PackedDecodeRequest(const DecodeBatchRequest& request, int64_t first,
                                      int64_t count, PlaceTensor place = CopyIntoMessage);
v1::DecodeRequest ListDecodeRequest(const DecodeBatchRequest& request, int64_t first,
                                    int64_t count);

// The answers of sequences [first, first + count) from a response in either form into
// `output` (plans appended). INVALID_ARGUMENT if the output memory does not fit them;
// INTERNAL if the response does not answer the request.
absl::Status ReadBatchAnswers(const DecodeBatchRequest& request, v1::DecodeResponse& response,
                              int64_t first, int64_t count, DecodeBatchOutput& output);

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_DECODE_BATCH_H_
