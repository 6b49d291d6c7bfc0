#include "client/loadgen/batch_decode.h"

#include <algorithm>

#include "client/decode_batch.h"

namespace mlaserve::loadgen {
namespace {

// The stacked tensors of one call, in the client's arrays (on the same-host plane its
// region: nothing is copied into the call or out of it); kept per thread for the client they
// came from, so a worker's steps reuse their memory.
struct Stacked {
  const client::ServingClient* client = nullptr;
  client::SharedArray q_nope, q_pe, latent, rows, out, lse;
};

// `array`, from `client`, holding at least `bytes`; its first `bytes`.
std::span<std::byte> Ensure(client::ServingClient& client, client::SharedArray& array,
                            uint64_t bytes) {
  if (array.owner == nullptr || array.bytes.size() < bytes) {
    array = {};  // the old block goes back first
    array = client.AllocateArray(bytes);
  }
  return array.bytes.first(bytes);
}

}  // namespace

LoadAnswer ToLoadAnswer(const v1::DecodePlan& p) {
  return {p.formulation() == v1::FORMULATION_HYBRID,
          p.group_size(),
          p.batch_size(),
          p.queue_us(),
          p.device_modeled_us(),
          p.device_host_us(),
          p.absorb_kv_dtype() == v1::KV_DTYPE_FP8};
}

absl::StatusOr<std::vector<LoadAnswer>> DecodeAsBatch(client::ServingClient& client,
                                                      const TargetModel& model,
                                                      const std::vector<LoadQuery>& queries) {
  if (queries.empty()) return absl::InvalidArgumentError("queries: none");
  const LoadQuery& first = queries.front();
  for (const LoadQuery& q : queries) {
    if (q.layer != first.layer || q.sq != first.sq || q.head_space != first.head_space ||
        q.append.size() != first.append.size()) {
      return absl::InvalidArgumentError(
          "queries: a packed call's queries share their layer, sq, space and appended rows");
    }
  }
  thread_local Stacked stacked;
  if (stacked.client != &client) {
    stacked = Stacked();
    stacked.client = &client;
  }
  const int64_t b = static_cast<int64_t>(queries.size());
  const int64_t sq = first.sq, heads = model.heads;
  client::DecodeBatchRequest request;
  request.layer = first.layer;
  request.output_dtype = v1::DTYPE_BF16;
  for (const LoadQuery& q : queries) request.sequence_ids.push_back(q.sequence_id);
  auto fill = [&](client::SharedArray& array, auto span_of, std::vector<int64_t> shape) {
    const size_t per = span_of(first).size();
    Bf16* into = reinterpret_cast<Bf16*>(
        Ensure(client, array, static_cast<uint64_t>(b) * per * sizeof(Bf16)).data());
    for (size_t i = 0; i < queries.size(); ++i) {
      const std::span<const Bf16> values = span_of(queries[i]);
      std::copy(values.begin(), values.end(), into + i * per);
    }
    return client::BatchTensor{v1::DTYPE_BF16, std::move(shape), into};
  };
  if (first.head_space) {
    request.q_nope =
        fill(stacked.q_nope, [](const LoadQuery& q) { return q.q_nope; }, {b, sq, heads, model.dn});
    request.q_pe =
        fill(stacked.q_pe, [](const LoadQuery& q) { return q.q_pe; }, {b, sq, heads, model.dr});
  } else {
    request.latent = fill(stacked.latent, [](const LoadQuery& q) { return q.q_latent; },
                          {b, sq, heads, model.dk()});
  }
  if (!first.append.empty()) {
    const int64_t n = static_cast<int64_t>(first.append.size()) / model.dk();
    request.append_rows =
        fill(stacked.rows, [](const LoadQuery& q) { return q.append; }, {b, n, model.dk()});
    for (const LoadQuery& q : queries) request.append_positions.push_back(q.append_position);
  }
  const int64_t width = first.head_space ? model.head_width() : model.dl;
  const auto rows_out = static_cast<uint64_t>(b * sq * heads);
  const std::span<std::byte> lse = Ensure(client, stacked.lse, rows_out * sizeof(float));
  client::DecodeBatchOutput output{
      Ensure(client, stacked.out, rows_out * static_cast<uint64_t>(width) * 2),
      std::span<float>(reinterpret_cast<float*>(lse.data()), rows_out),
      {}};
  if (absl::Status status = client.DecodeBatch(request, output); !status.ok()) {
    // A call that ended without its answer may still be answered into these arrays.
    stacked = Stacked();
    return status;
  }
  std::vector<LoadAnswer> answers;
  answers.reserve(output.plans.size());
  for (const v1::DecodePlan& plan : output.plans) answers.push_back(ToLoadAnswer(plan));
  return answers;
}

}  // namespace mlaserve::loadgen
