#ifndef MLASERVE_CLIENT_LOADGEN_SOAK_REPORT_H_
#define MLASERVE_CLIENT_LOADGEN_SOAK_REPORT_H_

#include <ostream>
#include <string>

#include "client/loadgen/soak.h"
#include "nlohmann/json.hpp"

namespace mlaserve::loadgen {

// A soak run as text for a person (what ran, calls, answers checked and the worst error,
// errors by code, the server's resources first and last with their drift, the verdict) and
// as one JSON object with every resource sample.
void PrintSoakReport(const SoakResult& result, const std::string& target, std::ostream& out);
nlohmann::json SoakToJson(const SoakResult& result);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_SOAK_REPORT_H_
