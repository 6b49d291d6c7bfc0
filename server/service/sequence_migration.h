#ifndef MLASERVE_SERVER_SERVICE_SEQUENCE_MIGRATION_H_
#define MLASERVE_SERVER_SERVICE_SEQUENCE_MIGRATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/serving_client.h"
#include "server/engine/engine.h"
#include "server/service/moved_sequences.h"

namespace mlaserve::service {

struct MigrationResult {
  int sequences = 0;
  int prefixes = 0;  // registered on the target
  int64_t tokens = 0;
  int64_t bytes = 0;
  absl::Duration took;
  absl::Duration held;  // calls naming the moving sequences waited (UNAVAILABLE) this long
};

// Moves `sequence_ids` (every sequence when empty) from `engine` to the server behind
// `target` (named `target_address` in redirects; this server is `instance_id`, which the
// target must not be), as any client would build them there:
// their prefix chains registered (a released prefix under a private id, released again once
// its sequences exist), the sequences created and their rows appended as the store holds
// them (bf16 rows, FP8 records byte for byte), so the target answers them bit for bit as this
// server did. Clients keep using the sequences here during the bulk copy; then calls naming
// them are held (UNAVAILABLE) while the rows appended meanwhile follow, and the sequences are
// released here, their calls answered with the new address (`moved`).
//
// NOT_FOUND naming sequence_ids[i] for an unknown sequence; FAILED_PRECONDITION for a
// sequence on an FP8 prefix (RegisterPrefix takes rows, which an FP8 prefix would
// requantise) or a target of another model; the target's error, naming it, when it refuses.
// On an error nothing moves: what the target got is released there and every sequence stays
// served here.
absl::StatusOr<MigrationResult> MigrateSequences(engine::Engine& engine, MovedSequences& moved,
                                                 client::ServingClient& target,
                                                 const std::string& target_address,
                                                 const std::string& instance_id,
                                                 std::vector<std::string> sequence_ids);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_SEQUENCE_MIGRATION_H_
