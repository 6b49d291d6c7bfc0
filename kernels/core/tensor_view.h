#ifndef MLASERVE_KERNELS_CORE_TENSOR_VIEW_H_
#define MLASERVE_KERNELS_CORE_TENSOR_VIEW_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlaserve {

// A non-owning, strided, rank-N view. Construction validates the shape and strides against
// the storage it is given, so indexing afterwards needs no checks on the hot path.
template <typename T, int kRank>
class TensorView {
  static_assert(kRank >= 1);

 public:
  using Index = std::array<int64_t, kRank>;

  TensorView() = default;

  // Row-major view over exactly the elements of `storage`.
  static absl::StatusOr<TensorView> Create(std::span<T> storage, Index shape,
                                           absl::string_view name = "tensor") {
    Index strides{};
    int64_t stride = 1;
    for (int i = kRank - 1; i >= 0; --i) {
      strides[i] = stride;
      if (shape[i] > 0 && stride > std::numeric_limits<int64_t>::max() / shape[i]) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": shape overflows int64"));
      }
      stride *= shape[i] < 0 ? 0 : shape[i];
    }
    auto view = CreateStrided(storage.data(), storage.size(), shape, strides, name);
    if (view.ok() && view->size() != static_cast<int64_t>(storage.size())) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": shape [", absl::StrJoin(shape, ","),
                                                     "] holds ", view->size(), " elements but ",
                                                     storage.size(), " were given"));
    }
    return view;
  }

  // General strided view; every addressable element must lie inside [data, data + capacity).
  static absl::StatusOr<TensorView> CreateStrided(T* data, std::size_t capacity, Index shape,
                                                  Index strides,
                                                  absl::string_view name = "tensor") {
    int64_t last = 0;  // largest offset reachable
    int64_t count = 1;
    for (int i = 0; i < kRank; ++i) {
      if (shape[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": dimension ", i, " is negative (", shape[i], ")"));
      }
      if (strides[i] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": stride ", i, " is negative"));
      }
      if (shape[i] > 0 && count > std::numeric_limits<int64_t>::max() / shape[i]) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": element count overflows int64"));
      }
      count *= shape[i];
      if (shape[i] > 0) {
        if (strides[i] > 0 &&
            shape[i] - 1 > (std::numeric_limits<int64_t>::max() - last) / strides[i]) {
          return absl::InvalidArgumentError(absl::StrCat(name, ": extent overflows int64"));
        }
        last += (shape[i] - 1) * strides[i];
      }
    }
    if (count > 0 && (data == nullptr || last >= static_cast<int64_t>(capacity))) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": shape [", absl::StrJoin(shape, ","), "] with strides [",
          absl::StrJoin(strides, ","), "] reaches element ", last, " of a buffer of ", capacity));
    }
    TensorView v;
    v.data_ = data;
    v.shape_ = shape;
    v.strides_ = strides;
    return v;
  }

  T* data() const { return data_; }
  const Index& shape() const { return shape_; }
  const Index& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  bool empty() const { return size() == 0; }

  template <typename... I>
  T& operator()(I... idx) const {
    static_assert(sizeof...(I) == kRank);
    const std::array<int64_t, kRank> index{static_cast<int64_t>(idx)...};
    int64_t offset = 0;
    for (int i = 0; i < kRank; ++i) offset += index[i] * strides_[i];
    return data_[offset];
  }

  // Pointer to the innermost row at a leading index (the last axis is usually contiguous).
  template <typename... I>
  T* row(I... idx) const {
    static_assert(sizeof...(I) == kRank - 1);
    const std::array<int64_t, kRank - 1> index{static_cast<int64_t>(idx)...};
    int64_t offset = 0;
    for (int i = 0; i < kRank - 1; ++i) offset += index[i] * strides_[i];
    return data_ + offset;
  }

  // Read-only alias, so kernels can take TensorView<const T, N>.
  operator TensorView<const T, kRank>() const requires(!std::is_const_v<T>) {
    TensorView<const T, kRank> v;
    v.data_ = data_;
    v.shape_ = shape_;
    v.strides_ = strides_;
    return v;
  }

 private:
  template <typename, int>
  friend class TensorView;

  T* data_ = nullptr;
  Index shape_{};
  Index strides_{};
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_TENSOR_VIEW_H_
