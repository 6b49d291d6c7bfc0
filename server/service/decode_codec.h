#ifndef MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_
#define MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/engine/engine.h"
#include "server/service/tensor_codec.h"

namespace mlaserve::service {

// Translation between the wire's Decode messages and the engine's DecodeQuery. The edge
// decodes the wire format only (the oneof, dtypes, byte lengths against declared shapes,
// the packed form's stacking); every rule about what a query may ask (layers, sq, shapes
// against the model, finiteness, appends, batch size) is the engine's
// (engine/decode_validation.h), so it is checked once, for every transport and in-process
// callers alike.

// Which of DecodeRequest's two forms carried the queries: the answers go back in the same.
enum class DecodeForm { kList, kPacked };

struct ParsedDecode {
  DecodeForm form = DecodeForm::kList;
  // Views of the request's bytes (bf16 tensors) or of `converted` (fp16/fp32 ones): valid
  // while `keep_alive` and this object live.
  std::vector<engine::DecodeQuery> queries;
  std::vector<std::vector<Bf16>> converted;
  // What the views point into (the message, or bytes copied out of a region), when this
  // object owns it; callers that keep the message themselves leave it empty.
  std::shared_ptr<const void> keep_alive;
  v1::DType output_dtype = v1::DTYPE_BF16;
  std::optional<float> softmax_scale;   // the engine checks it (ValidateDecodeOptions)
  std::optional<bool> batch_invariant;  // unset: the engine's default
};

// INVALID_ARGUMENT naming the field (`queries[3].head.q_nope: 4607 bytes != 2304 elements`,
// `packed.head.q_nope: shape [3,1,4,128] holds 3 sequences; sequence_ids has 4`) for
// anything the wire cannot carry. `source` gives the tensors' bytes (the message's own, or a
// registered region's).
absl::StatusOr<std::unique_ptr<ParsedDecode>> ParseDecodeRequest(
    const v1::DecodeRequest& request, TensorBytes& source = InlineTensorBytes());

// A status about a packed call's queries as the engine and the dispatcher name them
// (`queries[3].head.q_nope: ...`), in the packed form's fields (`packed.head.q_nope[3]: ...`),
// so a client reads the name of what it sent. Other statuses pass unchanged.
absl::Status NamePackedFields(const absl::Status& status);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_
