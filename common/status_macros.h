#ifndef MLASERVE_COMMON_STATUS_MACROS_H_
#define MLASERVE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Debian's abseil (20220623) has Status/StatusOr but not status_macros.h; these are the two
// macros the code base needs, spelled as in TensorFlow and Triton.

#define MLASERVE_STATUS_CONCAT_INNER_(a, b) a##b
#define MLASERVE_STATUS_CONCAT_(a, b) MLASERVE_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                             \
  do {                                                    \
    if (::absl::Status _status = (expr); !_status.ok()) { \
      return _status;                                     \
    }                                                     \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(MLASERVE_STATUS_CONCAT_(_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) {                             \
    return std::move(statusor).status();            \
  }                                                 \
  lhs = *std::move(statusor)

#endif  // MLASERVE_COMMON_STATUS_MACROS_H_
