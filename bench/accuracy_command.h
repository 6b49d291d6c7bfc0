#ifndef MLASERVE_BENCH_ACCURACY_COMMAND_H_
#define MLASERVE_BENCH_ACCURACY_COMMAND_H_

#include <ostream>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct AccuracyCommandOptions {
  int seeds = 5;
  bool json = false;
};

// `mlaserve-bench accuracy`: the AMLA paper's accuracy sweep, Base and AMLA (and AMLA with
// the other two compensation choices) against the fp64 golden reference.
absl::Status RunAccuracyCommand(const AccuracyCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_ACCURACY_COMMAND_H_
