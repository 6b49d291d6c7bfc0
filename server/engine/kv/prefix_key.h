#ifndef MLASERVE_SERVER_ENGINE_KV_PREFIX_KEY_H_
#define MLASERVE_SERVER_ENGINE_KV_PREFIX_KEY_H_

#include <cstdint>

namespace mlaserve::engine {

// Identifies one registration of a prefix for as long as it lives, never reused. A client's
// prefix id names a registration only until it is released (the id may then be registered
// again with other contents while the old prefix still serves the sequences started on it),
// so the planner groups sequences by key, not by id.
using PrefixKey = uint64_t;

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_PREFIX_KEY_H_
