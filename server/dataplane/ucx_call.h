#ifndef MLASERVE_SERVER_DATAPLANE_UCX_CALL_H_
#define MLASERVE_SERVER_DATAPLANE_UCX_CALL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "server/service/decode_answers.h"
#include "server/service/decode_codec.h"

namespace mlaserve::dataplane {

// One call's message on the UCX plane, parsed: what the dispatcher needs. The bytes are the
// active message's data (a DataPlaneCall whose tensors are inline), `header_id` the call id
// its header carried. `message` is the object to parse into: a connection reuses a few, so
// that a framework's same-shaped calls find their tensors' strings already allocated.
struct UcxCall {
  std::unique_ptr<service::ParsedDecode> call;  // views of `message`'s bytes
  absl::Time deadline = absl::InfiniteFuture();
};
absl::StatusOr<UcxCall> ParseUcxCall(uint64_t header_id, const void* data, size_t length,
                                     std::shared_ptr<v1::DataPlaneCall> message);

// A DataPlaneAnswer's bytes into the first `*size` bytes of `into` (grown when too short,
// never shrunk, so a reused buffer is neither reallocated nor cleared): `call_id`, the
// status, and on OK the answers as a DecodeResponse in the call's form, each output encoded
// once. The status the client gets (the answers' own check may turn OK into INTERNAL).
absl::Status WriteUcxAnswer(uint64_t call_id,
                            const absl::StatusOr<service::AnsweredDecode>& answered,
                            std::string& into, size_t* size);

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_UCX_CALL_H_
