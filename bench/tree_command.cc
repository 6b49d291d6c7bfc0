#include "bench/tree_command.h"

#include <algorithm>
#include <future>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"
#include "nlohmann/json.hpp"
#include "server/engine/engine.h"
#include "server/engine/owned_decode_query.h"

namespace mlaserve::bench {
namespace {

using engine::Engine;

// One decode call of every sequence, with what the plan and the device said about it.
struct Run {
  double modeled_us = 0;
  double host_ms = std::numeric_limits<double>::infinity();
  int32_t naive_tokens = 0;  // of a sequence on the first child
  int root_pass_tokens = 0;  // query tokens that shared the root's pass
  int hybrid = 0;            // queries that ran hybrid
};

absl::StatusOr<Run> DecodeAll(Engine& engine,
                              const std::vector<engine::OwnedDecodeQuery>& queries) {
  std::promise<absl::StatusOr<Run>> promise;
  engine.Decode(engine::Views(queries, engine.Info().model), {},
                [&](absl::StatusOr<std::span<const engine::DecodeAnswer>> answers) {
                  if (!answers.ok()) {
                    promise.set_value(answers.status());
                    return;
                  }
                  Run r;
                  const engine::PlanInfo& p = answers->front().plan;
                  r.modeled_us = p.device_modeled_us;
                  r.host_ms = p.device_host_ms;
                  r.naive_tokens = p.naive_tokens;
                  r.root_pass_tokens = p.naive_pass_query_tokens;
                  for (const engine::DecodeAnswer& a : *answers)
                    r.hybrid += a.plan.formulation == engine::Formulation::kHybrid;
                  promise.set_value(r);
                });
  return promise.get_future().get();
}

// An engine holding the tree: the root, its children, `batch` sequences on each with their
// own tokens; and one query per sequence.
struct Loaded {
  std::unique_ptr<Engine> engine;
  std::vector<engine::OwnedDecodeQuery> queries;
};

absl::StatusOr<Loaded> Load(const TreeCommandOptions& o, int batch, bool tree_aware) {
  engine::EngineOptions e;
  ASSIGN_OR_RETURN(e.model, engine::PresetModelConfig(o.model, {.layers = 1}));
  e.weights.seed = 1;
  e.profile = o.profile;
  e.devices = 1;
  e.host_threads_per_device = o.host_threads;
  e.kv.budget_bytes = int64_t{12} << 30;
  e.max_batch = std::max(256, o.children * batch);
  e.max_queue = e.max_batch;
  e.tree_aware_grouping = tree_aware;
  Loaded l;
  ASSIGN_OR_RETURN(l.engine, engine::CreateEngine(e));
  const engine::ModelConfig& m = l.engine->Info().model;
  const int dk = m.dk_latent();
  Rng rng(7);  // the same data in both engines
  auto rows = [&](int n) {
    std::vector<Bf16> r(static_cast<size_t>(n) * dk);
    FillNormal(r, 1.0, rng);
    return r;
  };
  const std::vector<Bf16> root = rows(o.shared);
  RETURN_IF_ERROR(l.engine->RegisterPrefix(
      "root", "", *TensorView<const Bf16, 3>::Create(root, {1, o.shared, dk})));
  for (int c = 0; c < o.children; ++c) {
    const std::string child = absl::StrCat("child", c);
    const std::vector<Bf16> own = rows(o.child_tokens);
    RETURN_IF_ERROR(l.engine->RegisterPrefix(
        child, "root", *TensorView<const Bf16, 3>::Create(own, {1, o.child_tokens, dk})));
    for (int s = 0; s < batch; ++s) {
      const std::string id = absl::StrCat(child, "/", s);
      RETURN_IF_ERROR(l.engine->CreateSequence(id, child));
      const std::vector<Bf16> suffix = rows(o.suffix);
      RETURN_IF_ERROR(
          l.engine->AppendKv(id, 0, o.shared + o.child_tokens,
                             *TensorView<const Bf16, 2>::Create(suffix, {o.suffix, dk})));
      engine::OwnedDecodeQuery q;
      q.sequence_id = id;
      q.q_nope.resize(static_cast<size_t>(m.heads) * m.dn);
      q.q_pe.resize(static_cast<size_t>(m.heads) * m.dr);
      FillNormal(q.q_nope, 1.0, rng);
      FillNormal(q.q_pe, 1.0, rng);
      l.queries.push_back(std::move(q));
    }
  }
  // Once, so that both runs below find the expansions they need built.
  RETURN_IF_ERROR(DecodeAll(*l.engine, l.queries).status());
  return l;
}

}  // namespace

absl::Status RunTreeCommand(const TreeCommandOptions& o, std::ostream& out) {
  if (!o.json) {
    out << HostDescription() << "\n";
    out << absl::StrFormat(
        "TyphoonMLA over a prefix tree on one %s: %s, root %d tokens, %d children of %d tokens, B "
        "sequences on each "
        "with %d of their own; one call of all children x B queries; tree-aware vs flat grouping, "
        "best of %d\n",
        o.profile, o.model, o.shared, o.children, o.child_tokens, o.suffix, o.rounds);
    out << absl::StrFormat("%5s %6s %7s %7s %9s %11s %10s %12s %12s\n", "B", "mode", "hybrid",
                           "naive", "root_pass", "modeled_us", "host_ms", "flat/tree_us",
                           "flat/tree_ms");
  }
  for (int batch : o.batch) {
    ASSIGN_OR_RETURN(Loaded tree, Load(o, batch, true));
    ASSIGN_OR_RETURN(Loaded flat, Load(o, batch, false));
    Run best_tree, best_flat;
    for (int round = 0; round < std::max(1, o.rounds); ++round) {
      for (bool tree_aware : {true, false}) {
        Loaded& l = tree_aware ? tree : flat;
        ASSIGN_OR_RETURN(Run r, DecodeAll(*l.engine, l.queries));
        Run& best = tree_aware ? best_tree : best_flat;
        const double host = std::min(best.host_ms, r.host_ms);
        best = r;
        best.host_ms = host;
      }
    }
    for (bool tree_aware : {true, false}) {
      const Run& r = tree_aware ? best_tree : best_flat;
      const char* mode = tree_aware ? "tree" : "flat";
      if (o.json) {
        out << nlohmann::json{{"batch", batch},
                              {"children", o.children},
                              {"mode", mode},
                              {"hybrid_queries", r.hybrid},
                              {"naive_tokens", r.naive_tokens},
                              {"root_pass_query_tokens", r.root_pass_tokens},
                              {"modeled_us", r.modeled_us},
                              {"host_ms", r.host_ms},
                              {"host", HostDescription()}}
                   .dump()
            << "\n";
      } else {
        out << absl::StrFormat("%5d %6s %7d %7d %9d %11.1f %10.1f", batch, mode, r.hybrid,
                               r.naive_tokens, r.root_pass_tokens, r.modeled_us, r.host_ms);
        if (!tree_aware) {
          out << absl::StrFormat(" %12.2f %12.2f", r.modeled_us / best_tree.modeled_us,
                                 r.host_ms / best_tree.host_ms);
        }
        out << "\n";
      }
    }
    out.flush();
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
