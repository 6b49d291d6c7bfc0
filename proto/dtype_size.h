#ifndef MLASERVE_PROTO_DTYPE_SIZE_H_
#define MLASERVE_PROTO_DTYPE_SIZE_H_

#include <cstddef>

#include "mlaserve/v1/tensor.pb.h"

namespace mlaserve {

// Bytes of one element of a wire dtype; 0 for one the API does not define. Client and server
// size tensors by the same function.
inline std::size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      return 2;
    case v1::DTYPE_FP32:
      return 4;
    default:
      return 0;
  }
}

}  // namespace mlaserve

#endif  // MLASERVE_PROTO_DTYPE_SIZE_H_
