// The C++ cluster client against a real etcd (Debian's, on loopback) and three real servers
// in this process, each registered as the server binary registers itself: placement,
// routing, context-parallel decode against the fp64 golden, a server that leaves, etcd that
// stops and comes back (docs/cluster.md).

#include "tests/integration/cluster_client_fixture.h"

namespace mlaserve::integration {
namespace {

TEST_F(ClusterClientTest, APrefixsSequencesGoWhereItIsUntilTheSpreadGroupThenItIsRegisteredOnMore) {
  std::unique_ptr<client::ClusterClient> cluster = Connect();
  ASSERT_NE(cluster, nullptr);
  // Without a prefix, on empty servers: by room, and this client's own placements count
  // against it (the records lag), so a burst spreads.
  std::set<std::string> used;
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("free", i);
    ASSERT_TRUE(cluster->CreateSequence(id).ok());
    used.insert(cluster->ServersOf(id)->front());
  }
  EXPECT_EQ(used.size(), 3u);

  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  const std::vector<Bf16> latent =
      RandomBf16(static_cast<size_t>(model.layers) * 40 * width, 1.0, rng_);
  ASSERT_TRUE(cluster->RegisterPrefix("system", "", Tensor3(latent, model.layers, 40, width)).ok());
  const std::vector<std::string> first = cluster->PrefixServers("system");
  ASSERT_EQ(first.size(), 1u);

  // spread_group 2: two sequences on the prefix's server, then the prefix goes to a second.
  for (int i = 0; i < 2; ++i) {
    const std::string id = absl::StrCat("s", i);
    ASSERT_TRUE(cluster->CreateSequence(id, "system").ok());
    EXPECT_THAT(*cluster->ServersOf(id), ::testing::ElementsAre(first[0]));
    EXPECT_TRUE(Holds(first[0], id));
  }
  ASSERT_TRUE(cluster->CreateSequence("s2", "system").ok());
  const std::string second = cluster->ServersOf("s2")->front();
  EXPECT_NE(second, first[0]);
  EXPECT_TRUE(Holds(second, "s2"));
  EXPECT_THAT(cluster->PrefixServers("system"), ::testing::UnorderedElementsAre(first[0], second));
  absl::StatusOr<v1::ListPrefixesResponse> prefixes = At(second).server->client().ListPrefixes(10);
  ASSERT_TRUE(prefixes.ok());
  ASSERT_EQ(prefixes->prefixes_size(), 1);
  EXPECT_EQ(prefixes->prefixes(0).prefix_id(), "system");
  // The next goes to the new server's group, which is the smaller.
  ASSERT_TRUE(cluster->CreateSequence("s3", "system").ok());
  EXPECT_EQ(cluster->ServersOf("s3")->front(), second);

  EXPECT_TRUE(absl::IsAlreadyExists(cluster->CreateSequence("s0", "system").status()));
  EXPECT_TRUE(absl::IsNotFound(cluster->CreateSequence("x", "no-such-prefix").status()));
}

TEST_F(ClusterClientTest, ADecodeOverSeveralServersFansOutAndEachAnswerIsTheServersOwn) {
  std::unique_ptr<client::ClusterClient> cluster = Connect();
  ASSERT_NE(cluster, nullptr);
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  const int layer = 1;
  std::vector<v1::DecodeQuery> queries;
  std::vector<GoldenOutput> goldens;
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("q", i);
    ASSERT_TRUE(cluster->CreateSequence(id).ok());
    const int tokens = 20 + 7 * i;
    const std::vector<Bf16> rows = RandomBf16(static_cast<size_t>(tokens) * width, 1.0, rng_);
    ASSERT_TRUE(cluster->AppendKv(id, layer, 0, Tensor2(rows, tokens, width)).ok());
    const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng_);
    queries.push_back(client::LatentQuery(id, layer, 1, Tensor3(q, 1, model.heads, width)));
    goldens.push_back(GoldenLatent(model, rows, q, 1));
  }
  absl::StatusOr<v1::DecodeResponse> through_cluster = cluster->DecodeRaw([&] {
    v1::DecodeRequest request;
    for (const v1::DecodeQuery& q : queries) *request.add_queries() = q;
    return request;
  }());
  ASSERT_TRUE(through_cluster.ok()) << through_cluster.status();
  ASSERT_EQ(through_cluster->results_size(), 4);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(absl::StrCat("query ", i));
    // The same query sent to its server directly: the cluster client adds nothing.
    v1::DecodeRequest direct;
    *direct.add_queries() = queries[i];
    absl::StatusOr<v1::DecodeResponse> answer =
        At(cluster->ServersOf(queries[i].sequence_id())->front())
            .server->client()
            .DecodeRaw(direct);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->results(0).out().data(), through_cluster->results(i).out().data());
    EXPECT_EQ(answer->results(0).lse().data(), through_cluster->results(i).lse().data());
    absl::StatusOr<std::vector<client::DecodeOutput>> outputs =
        client::ToDecodeOutputs(*through_cluster);
    ASSERT_TRUE(outputs.ok());
    EXPECT_TRUE(testing::AllClose((*outputs)[i].out, goldens[i].out, kLatentOutTolerance, true));
    EXPECT_TRUE(testing::AllClose((*outputs)[i].lse, goldens[i].lse, kLatentLseTolerance, false));
  }
}

// A sequence on a 24-token prefix, split every 32 positions, grows over three servers; latent
// and head-space decodes (one and two tokens, with the new rows appended by the decode) equal
// the golden over the whole sequence.
TEST_F(ClusterClientTest, AContextParallelSequenceOverThreeServersDecodesAsOneSequence) {
  constexpr int kPrefix = 24, kPart = 32;
  std::unique_ptr<client::ClusterClient> cluster = Connect(kPart);
  ASSERT_NE(cluster, nullptr);
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  absl::StatusOr<engine::ModelWeights> weights =
      engine::ModelWeights::FromSeed(model, kWeightsSeed);
  ASSERT_TRUE(weights.ok());
  const std::vector<Bf16> prefix =
      RandomBf16(static_cast<size_t>(model.layers) * kPrefix * width, 1.0, rng_);
  ASSERT_TRUE(cluster->RegisterPrefix("p", "", Tensor3(prefix, model.layers, kPrefix, width)).ok());
  ASSERT_TRUE(cluster->CreateSequence("long", "p").ok());
  // Both layers, 70 positions after the prefix in uneven chunks: parts [0,56) [56,88) [88,..).
  std::vector<std::vector<Bf16>> rows(model.layers);
  for (int layer = 0; layer < model.layers; ++layer) {
    rows[layer] = LayerRows(prefix, layer, kPrefix, width);
    int position = kPrefix;
    for (int chunk : {5, 40, 25}) {
      const std::vector<Bf16> appended = RandomBf16(static_cast<size_t>(chunk) * width, 1.0, rng_);
      ASSERT_TRUE(cluster->AppendKv("long", layer, position, Tensor2(appended, chunk, width)).ok());
      rows[layer].insert(rows[layer].end(), appended.begin(), appended.end());
      position += chunk;
    }
  }
  const std::vector<std::string> servers = *cluster->ServersOf("long");
  ASSERT_EQ(servers.size(), 3u);
  EXPECT_EQ(std::set<std::string>(servers.begin(), servers.end()).size(), 3u);
  EXPECT_TRUE(Holds(servers[1], "long@p1"));
  EXPECT_TRUE(Holds(servers[2], "long@p2"));

  for (int sq : {1, 2}) {
    for (bool head : {false, true}) {
      SCOPED_TRACE(absl::StrCat("sq ", sq, head ? " head space" : " latent"));
      const int layer = head ? 0 : 1;
      // The decode appends the sq new tokens' rows first (they land in the last part).
      const std::vector<Bf16> fresh = RandomBf16(static_cast<size_t>(sq) * width, 1.0, rng_);
      const int64_t position = static_cast<int64_t>(rows[layer].size() / width);
      rows[layer].insert(rows[layer].end(), fresh.begin(), fresh.end());
      const size_t token_heads = static_cast<size_t>(sq) * model.heads;
      v1::DecodeQuery query;
      GoldenOutput golden;
      if (head) {
        const std::vector<Bf16> q_nope = RandomBf16(token_heads * model.dn, 1.0, rng_);
        const std::vector<Bf16> q_pe = RandomBf16(token_heads * model.dr, 1.0, rng_);
        query =
            client::HeadSpaceQuery("long", layer, sq, Tensor3(q_nope, sq, model.heads, model.dn),
                                   Tensor3(q_pe, sq, model.heads, model.dr));
        golden = GoldenHeadSpace(model, weights->Layer(layer), rows[layer], q_nope, q_pe, sq);
      } else {
        const std::vector<Bf16> q = RandomBf16(token_heads * width, 1.0, rng_);
        query = client::LatentQuery("long", layer, sq, Tensor3(q, sq, model.heads, width));
        golden = GoldenLatent(model, rows[layer], q, sq);
      }
      client::AppendBeforeDecode(query, Tensor2(fresh, sq, width), position);
      absl::StatusOr<std::vector<client::DecodeOutput>> answer =
          cluster->Decode({query}, v1::DTYPE_FP32);
      ASSERT_TRUE(answer.ok()) << answer.status();
      EXPECT_TRUE(testing::AllClose((*answer)[0].out, golden.out,
                                    head ? kHeadSpaceOutTolerance : kLatentOutTolerance, true));
      EXPECT_TRUE(testing::AllClose((*answer)[0].lse, golden.lse,
                                    head ? kHeadSpaceLseTolerance : kLatentLseTolerance, false));
    }
  }
  ASSERT_TRUE(cluster->ReleaseSequence("long").ok());
  EXPECT_FALSE(Holds(servers[1], "long@p1"));
  EXPECT_FALSE(Holds(servers[2], "long@p2"));
}

TEST_F(ClusterClientTest, ASequenceOnAServerThatLeftFailsAtOnceNamingItAndOthersAnswer) {
  std::unique_ptr<client::ClusterClient> cluster = Connect();
  ASSERT_NE(cluster, nullptr);
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(absl::StrCat("f", i));
    ASSERT_TRUE(cluster->CreateSequence(ids.back()).ok());
    const std::vector<Bf16> rows = RandomBf16(8 * static_cast<size_t>(width), 1.0, rng_);
    ASSERT_TRUE(cluster->AppendKv(ids.back(), 0, 0, Tensor2(rows, 8, width)).ok());
  }
  const std::string lost_address = cluster->ServersOf("f0")->front();
  Member& lost = At(lost_address);
  const int64_t seen = cluster->membership().changes();
  lost.membership->Leave();  // its key goes, as when a lease runs out
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (cluster->membership().Members().size() == members_.size() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(cluster->membership().changes(), seen);
  const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng_);
  for (const std::string& id : ids) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<client::DecodeOutput>> answer =
        cluster->Decode({client::LatentQuery(id, 0, 1, Tensor3(q, 1, model.heads, width))});
    if (cluster->ServersOf(id)->front() == lost_address) {
      EXPECT_TRUE(absl::IsUnavailable(answer.status())) << answer.status();
      EXPECT_THAT(answer.status().message(), ::testing::HasSubstr(lost_address));
      EXPECT_THAT(answer.status().message(), ::testing::HasSubstr("has left cluster"));
      EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
    } else {
      EXPECT_TRUE(answer.ok()) << id << ": " << answer.status();
    }
  }
  // New sequences avoid it; releasing the lost one just forgets it.
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("after", i);
    ASSERT_TRUE(cluster->CreateSequence(id).ok());
    EXPECT_NE(cluster->ServersOf(id)->front(), lost_address);
  }
  EXPECT_TRUE(cluster->ReleaseSequence("f0").ok());
  EXPECT_TRUE(absl::IsNotFound(cluster->ServersOf("f0").status()));
}

TEST_F(ClusterClientTest, WithEtcdDownSequencesAnswerAndPlacementUsesTheLastMembership) {
  std::unique_ptr<client::ClusterClient> cluster = Connect();
  ASSERT_NE(cluster, nullptr);
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  ASSERT_TRUE(cluster->CreateSequence("before").ok());
  const std::vector<Bf16> rows = RandomBf16(4 * static_cast<size_t>(width), 1.0, rng_);
  ASSERT_TRUE(cluster->AppendKv("before", 0, 0, Tensor2(rows, 4, width)).ok());

  etcd_.Stop();
  absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (!cluster->membership().stale() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(cluster->membership().stale());
  EXPECT_EQ(cluster->membership().Members().size(), members_.size());
  const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng_);
  EXPECT_TRUE(
      cluster->Decode({client::LatentQuery("before", 0, 1, Tensor3(q, 1, model.heads, width))})
          .ok());
  EXPECT_TRUE(cluster->CreateSequence("during").ok());

  etcd_.Start();
  deadline = absl::Now() + absl::Seconds(20);
  while (cluster->membership().stale() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(cluster->membership().stale());
}

// The rows of one latent decode query answered by `client` (one query per call, so the batch,
// and with it every rounding, is the same wherever it runs).
std::string Answer(client::ServingClient& client, const v1::DecodeQuery& query) {
  v1::DecodeRequest request;
  *request.add_queries() = query;
  request.set_output_dtype(v1::DTYPE_FP32);
  absl::StatusOr<v1::DecodeResponse> response = client.DecodeRaw(request);
  EXPECT_TRUE(response.ok()) << response.status();
  if (!response.ok()) return "";
  return response->results(0).out().data() + response->results(0).lse().data();
}

// Sequences on a bf16 prefix, and an FP8 one, move from one server to another: the target
// answers them bit for bit as the source did, the source redirects calls naming them, and the
// cluster client follows without being told.
TEST_F(ClusterClientTest, AMoveKeepsEveryAnswerBitForBitAndClientsFollowIt) {
  std::unique_ptr<client::ClusterClient> cluster = Connect();
  ASSERT_NE(cluster, nullptr);
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  const std::vector<Bf16> prefix =
      RandomBf16(static_cast<size_t>(model.layers) * 40 * width, 1.0, rng_);
  ASSERT_TRUE(cluster->RegisterPrefix("p", "", Tensor3(prefix, model.layers, 40, width)).ok());
  std::vector<std::string> ids = {"m0", "m1"};
  for (const std::string& id : ids) ASSERT_TRUE(cluster->CreateSequence(id, "p").ok());
  ASSERT_TRUE(cluster->CreateSequence("m-fp8", "", v1::KV_DTYPE_FP8).ok());
  ids.push_back("m-fp8");
  std::vector<v1::DecodeQuery> queries;
  for (const std::string& id : ids) {
    const int64_t start = id == "m-fp8" ? 0 : 40;
    for (int layer = 0; layer < model.layers; ++layer) {
      const std::vector<Bf16> rows = RandomBf16(37 * static_cast<size_t>(width), 1.0, rng_);
      ASSERT_TRUE(cluster->AppendKv(id, layer, start, Tensor2(rows, 37, width)).ok());
    }
    const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng_);
    queries.push_back(client::LatentQuery(id, 1, 1, Tensor3(q, 1, model.heads, width)));
  }
  std::vector<std::string> before;
  for (const v1::DecodeQuery& query : queries) before.push_back(Answer(*cluster, query));

  // Each server's sequences move to the next server.
  std::map<std::string, std::vector<std::string>> by_server;
  for (const std::string& id : ids) by_server[cluster->ServersOf(id)->front()].push_back(id);
  std::map<std::string, std::string> destination_of;  // sequence -> where it went
  for (const auto& [source, moving] : by_server) {
    std::string destination;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].server->target() == source) {
        destination = members_[(i + 1) % members_.size()].server->target();
      }
    }
    v1::MigrateSequencesRequest move;
    move.set_target(destination);
    for (const std::string& id : moving) move.add_sequence_ids(id);
    absl::StatusOr<v1::MigrateSequencesResponse> moved =
        At(source).server->client().MigrateSequences(move, absl::Seconds(60));
    ASSERT_TRUE(moved.ok()) << moved.status();
    EXPECT_EQ(moved->sequences(), static_cast<int>(moving.size()));
    const bool on_prefix = moving.front() != "m-fp8";
    EXPECT_EQ(moved->prefixes(), on_prefix ? 1 : 0);
    EXPECT_EQ(moved->tokens(),
              (on_prefix ? 40 : 0) + static_cast<int64_t>(moving.size()) * model.layers * 37);
    for (const std::string& id : moving) {
      destination_of[id] = destination;
      EXPECT_FALSE(Holds(source, id));
      EXPECT_TRUE(Holds(destination, id));
    }
    // The source names the new server.
    v1::DecodeRequest direct;
    for (const v1::DecodeQuery& query : queries) {
      if (query.sequence_id() == moving.front()) *direct.add_queries() = query;
    }
    absl::StatusOr<v1::DecodeResponse> refused = At(source).server->client().DecodeRaw(direct);
    ASSERT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr(
                    absl::StrCat("sequence '", moving.front(), "' moved to server ", destination)));
  }
  // Through the cluster client, unchanged code: the same bits from the new servers.
  for (size_t i = 0; i < queries.size(); ++i) {
    EXPECT_EQ(Answer(*cluster, queries[i]), before[i]) << ids[i];
    EXPECT_THAT(*cluster->ServersOf(ids[i]), ::testing::ElementsAre(destination_of[ids[i]]));
  }
  // And it goes on there: appends, releases.
  const std::vector<Bf16> more = RandomBf16(static_cast<size_t>(width), 1.0, rng_);
  EXPECT_TRUE(cluster->AppendKv("m0", 0, 77, Tensor2(more, 1, width)).ok());
  for (const std::string& id : ids) EXPECT_TRUE(cluster->ReleaseSequence(id).ok());
  EXPECT_FALSE(Holds(destination_of["m0"], "m0"));
}

TEST_F(ClusterClientTest, AMoveUnderLoadLosesNoRowAndFailsNoCall) { MoveUnderLoad(); }

// Servers whose KV cache lives in a GPU's memory: the moved rows reach the destination's
// device copy, every step's appended row reaches the device that answers it (each answer
// against the golden). The fake GPU here; MLASERVE_TEST_GPU=cuda:0 puts the three servers on
// one GPU.
class ClusterOnGpusTest : public ClusterClientTest {
 protected:
  std::string gpu() const override { return TestGpu(); }
};

TEST_F(ClusterOnGpusTest, AMoveUnderLoadLosesNoRowAndFailsNoCall) { MoveUnderLoad(); }

TEST_F(ClusterClientTest, AMoveThatCannotHappenSaysWhyAndChangesNothing) {
  std::unique_ptr<client::ClusterClient> cluster = Connect();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateSequence("stays").ok());
  const std::string source = cluster->ServersOf("stays")->front();
  client::MlaServeClient& admin = At(source).server->client();
  auto move = [&](const std::string& target, std::vector<std::string> ids, bool leave = false) {
    v1::MigrateSequencesRequest request;
    request.set_target(target);
    for (const std::string& id : ids) request.add_sequence_ids(id);
    request.set_leave_cluster(leave);
    return admin.MigrateSequences(request, absl::Seconds(30)).status();
  };
  std::string other;
  for (const Member& m : members_) {
    if (m.server->target() != source) other = m.server->target();
  }
  absl::Status status = move("no port", {"stays"});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("target"));
  status = move(other, {"stays", "nobody"});
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("sequence_ids[1]"));
  status = move(absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort()), {"stays"});
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("target: server 127.0.0.1:"));
  status = move(source, {"stays"});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  status = move(other, {"stays"}, /*leave=*/true);  // these servers have no cluster hooks
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("leave_cluster"));
  EXPECT_TRUE(Holds(source, "stays"));
  EXPECT_FALSE(Holds(other, "stays"));
  EXPECT_EQ(cluster->ServersOf("stays")->front(), source);
}

// A server that goes (its key removed, as when its lease runs out) and comes back at its
// address with its --state_dir (systemd's restart): calls for its sequences fail at once
// while it is away, naming it, and answer as before once it is back.
TEST_F(ClusterClientTest, ASequenceAnswersAgainWhenItsServerRestartsWithItsState) {
  static ::mlaserve::testing::ScratchDir state("cluster-restart");
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  service::ServerOptions with_state;
  with_state.state_dir = state.Path("a");
  std::filesystem::create_directories(with_state.state_dir);
  cluster::MembershipOptions membership;
  membership.cluster = "restart-test";
  membership.lease_ttl = absl::Seconds(3);
  membership.refresh_interval = absl::Milliseconds(500);
  auto start = [&](int port) {
    Member m;
    m.server = std::make_unique<IntegrationServer>(SmallEngineOptions(model), "", with_state, port);
    auto joined = cluster::ClusterMembership::Start(
        etcd_.Client(), membership,
        cluster::DescribeServer(m.server->server(), m.server->target(), "test"));
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (joined.ok()) m.membership = *std::move(joined);
    return m;
  };
  Member lone = start(0);
  const int port = lone.server->server().port();
  client::ClusterOptions options;
  options.etcd_endpoints = {etcd_.endpoint()};
  options.cluster = "restart-test";
  options.expected_sequence_tokens = 256;
  absl::StatusOr<std::unique_ptr<client::ClusterClient>> cluster =
      client::ClusterClient::Connect(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->CreateSequence("kept").ok());
  const std::vector<Bf16> rows = RandomBf16(20 * static_cast<size_t>(width), 1.0, rng_);
  ASSERT_TRUE((*cluster)->AppendKv("kept", 1, 0, Tensor2(rows, 20, width)).ok());
  const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng_);
  const v1::DecodeQuery query =
      client::LatentQuery("kept", 1, 1, Tensor3(q, 1, model.heads, width));
  const std::string before = Answer(**cluster, query);

  lone.membership->Leave();
  lone = Member();  // stopped; its state saved
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!(*cluster)->membership().Members().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  v1::DecodeRequest request;
  *request.add_queries() = query;
  absl::StatusOr<v1::DecodeResponse> away = (*cluster)->DecodeRaw(request);
  ASSERT_TRUE(absl::IsUnavailable(away.status())) << away.status();
  EXPECT_THAT(away.status().message(), ::testing::HasSubstr("has left cluster 'restart-test'"));

  lone = start(port);
  deadline = absl::Now() + absl::Seconds(10);
  while ((*cluster)->membership().Members().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Answer(**cluster, query), before);
}

}  // namespace
}  // namespace mlaserve::integration
