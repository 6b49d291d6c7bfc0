#ifndef MLASERVE_SERVER_ENGINE_OWNED_DECODE_QUERY_H_
#define MLASERVE_SERVER_ENGINE_OWNED_DECODE_QUERY_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/engine_types.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {

// A decode query that owns its tensors, for in-process callers that build queries themselves
// (the server's warm-up, the benchmarks, tests). DecodeQuery itself only views memory, so
// the gRPC edge can hand the engine the request's own bytes; View() gives the engine's view
// of this one, valid while it lives unchanged.
struct OwnedDecodeQuery {
  std::string sequence_id;
  int layer = 0;
  int sq = 1;
  QuerySpace space = QuerySpace::kHead;
  std::vector<Bf16> q_nope;       // [sq][heads][dn]
  std::vector<Bf16> q_pe;         // [sq][heads][dr]
  std::vector<Bf16> q_latent;     // [sq][heads][dl + dr]
  std::vector<Bf16> append_rows;  // [n][dl + dr]
  int64_t append_position = -1;
  ElementType output = ElementType::kBf16;
  int heads = 0;       // 0: the model's
  int first_head = 0;  // head space: the first of the model's heads q holds

  // Tensors shaped [sq][heads][size / (sq heads)] (and [n][dl + dr] for the rows); a size
  // that does not divide so is shaped [1][1][size], for the engine to refuse.
  DecodeQuery View(const ModelConfig& model) const {
    DecodeQuery q;
    q.sequence_id = sequence_id;
    q.layer = layer;
    q.sq = sq;
    q.space = space;
    q.q_nope = Shaped(q_nope, model);
    q.q_pe = Shaped(q_pe, model);
    q.q_latent = Shaped(q_latent, model);
    if (!append_rows.empty()) {
      const int64_t width = model.dk_latent();
      const int64_t n = static_cast<int64_t>(append_rows.size());
      const TensorView<const Bf16, 2>::Index shape =
          n % width == 0 ? TensorView<const Bf16, 2>::Index{n / width, width}
                         : TensorView<const Bf16, 2>::Index{1, n};
      q.append_rows = *TensorView<const Bf16, 2>::Create(std::span<const Bf16>(append_rows), shape);
    }
    q.append_position = append_position;
    q.output = output;
    q.first_head = first_head;
    return q;
  }

 private:
  TensorView<const Bf16, 3> Shaped(const std::vector<Bf16>& values,
                                   const ModelConfig& model) const {
    if (values.empty()) return {};
    const int64_t n = static_cast<int64_t>(values.size());
    const int64_t h = heads > 0 ? heads : model.heads;
    const int64_t outer = int64_t{sq > 0 ? sq : 1} * h;
    const TensorView<const Bf16, 3>::Index shape =
        n % outer == 0 && sq > 0 ? TensorView<const Bf16, 3>::Index{sq, h, n / outer}
                                 : TensorView<const Bf16, 3>::Index{1, 1, n};
    return *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(values), shape);
  }
};

// Views of several owned queries, in order.
inline std::vector<DecodeQuery> Views(std::span<const OwnedDecodeQuery> queries,
                                      const ModelConfig& model) {
  std::vector<DecodeQuery> views;
  views.reserve(queries.size());
  for (const OwnedDecodeQuery& q : queries) views.push_back(q.View(model));
  return views;
}

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_OWNED_DECODE_QUERY_H_
