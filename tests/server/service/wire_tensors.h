#ifndef MLASERVE_TESTS_SERVER_SERVICE_WIRE_TENSORS_H_
#define MLASERVE_TESTS_SERVER_SERVICE_WIRE_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "mlaserve/v1/tensor.pb.h"

namespace mlaserve::service::testing {

// A well-formed bf16 wire tensor of `shape`, all zeros: the codecs' tests vary one field of it.
inline v1::Tensor Bf16Zeros(const std::vector<int64_t>& shape) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::DTYPE_BF16);
  int64_t count = 1;
  for (const int64_t d : shape) {
    tensor.add_shape(d);
    count *= d;
  }
  tensor.set_data(std::string(static_cast<size_t>(count) * 2, '\0'));
  return tensor;
}

}  // namespace mlaserve::service::testing

#endif  // MLASERVE_TESTS_SERVER_SERVICE_WIRE_TENSORS_H_
