#include "client/loadgen/batch_decode.h"

#include <algorithm>

#include "client/decode_batch.h"

namespace mlaserve::loadgen {
namespace {

// The stacked tensors of one call; kept per thread, so a worker's steps reuse their memory.
struct Stacked {
  std::vector<Bf16> q_nope, q_pe, latent, rows;
  std::vector<std::byte> out;
  std::vector<float> lse;
};

void Gather(std::vector<Bf16>& into, std::span<const Bf16> values, size_t index) {
  std::copy(values.begin(), values.end(),
            into.begin() + static_cast<ptrdiff_t>(index * values.size()));
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
  const int64_t b = static_cast<int64_t>(queries.size());
  const int64_t sq = first.sq, heads = model.heads;
  client::DecodeBatchRequest request;
  request.layer = first.layer;
  request.output_dtype = v1::DTYPE_BF16;
  for (const LoadQuery& q : queries) request.sequence_ids.push_back(q.sequence_id);
  auto fill = [&](std::vector<Bf16>& into, auto span_of, std::vector<int64_t> shape) {
    into.resize(static_cast<size_t>(b) * span_of(first).size());
    for (size_t i = 0; i < queries.size(); ++i) Gather(into, span_of(queries[i]), i);
    return client::BatchTensor{v1::DTYPE_BF16, std::move(shape), into.data()};
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
  stacked.out.resize(static_cast<size_t>(b * sq * heads * width) * 2);
  stacked.lse.resize(static_cast<size_t>(b * sq * heads));
  client::DecodeBatchOutput output{stacked.out, stacked.lse, {}};
  if (absl::Status status = client.DecodeBatch(request, output); !status.ok()) return status;
  std::vector<LoadAnswer> answers;
  answers.reserve(output.plans.size());
  for (const v1::DecodePlan& plan : output.plans) answers.push_back(ToLoadAnswer(plan));
  return answers;
}

}  // namespace mlaserve::loadgen
