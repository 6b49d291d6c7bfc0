#ifndef MLASERVE_CLIENT_LOADGEN_SWEEP_OUTPUT_H_
#define MLASERVE_CLIENT_LOADGEN_SWEEP_OUTPUT_H_

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace mlaserve::loadgen {

// --out=PATH writes PATH.json and PATH.csv: PATH's folder is created if missing, and both
// files must be writable there (INVALID_ARGUMENT naming --out otherwise).
absl::Status PrepareSweepOutput(const std::string& out);

// The client machine, for the sweep's files: numbers mean little without it.
nlohmann::json ClientMachine();

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_SWEEP_OUTPUT_H_
