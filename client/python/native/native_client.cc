// mlaserve._native: the C++ client for Python (docs/api.md, "Python over the data plane").
// A framework's per-layer call, Client.decode_batch, goes through it when it is built: numpy
// arrays (and CPU torch tensors, as the numpy views the Python side makes of them) are read
// in place through the buffer protocol and the answers are written into numpy arrays made
// here, over the same-host data plane when the server offers one on this host, else over
// gRPC's packed form. The GIL is released while a call is on its way.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "client/mlaserve_client.h"

namespace py = pybind11;

namespace mlaserve::python {
namespace {

// A C-contiguous array as a batch tensor: uint16 is bf16 bits (numpy has no bfloat16),
// float16 and float32 are themselves.
client::BatchTensor Tensor(const std::optional<py::buffer>& array, const char* name) {
  if (!array.has_value()) return {};
  const py::buffer_info info = array->request();
  v1::DType dtype;
  if (info.format == py::format_descriptor<uint16_t>::format() || info.format == "H") {
    dtype = v1::DTYPE_BF16;
  } else if (info.format == "e") {
    dtype = v1::DTYPE_FP16;
  } else if (info.format == py::format_descriptor<float>::format()) {
    dtype = v1::DTYPE_FP32;
  } else {
    throw py::value_error(std::string(name) + ": dtype '" + info.format +
                          "' is not uint16 (bf16 bits), float16 or float32");
  }
  py::ssize_t stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != stride) {
      throw py::value_error(std::string(name) + ": not C-contiguous");
    }
    stride *= info.shape[d];
  }
  return {dtype, std::vector<int64_t>(info.shape.begin(), info.shape.end()), info.ptr};
}

v1::DType OutputDType(const std::string& name) {
  if (name == "bf16") return v1::DTYPE_BF16;
  if (name == "fp16") return v1::DTYPE_FP16;
  if (name == "fp32") return v1::DTYPE_FP32;
  throw py::value_error("output_dtype: '" + name + "' is not bf16, fp16 or fp32");
}

// The status as the Python client raises a server's refusal: (code number, message).
[[noreturn]] void Raise(const absl::Status& status) {
  py::object error = py::module_::import("mlaserve.native").attr("NativeCallError");
  PyErr_SetObject(
      error.ptr(),
      py::make_tuple(static_cast<int>(status.code()), std::string(status.message())).ptr());
  throw py::error_already_set();
}

class NativeClient {
 public:
  NativeClient(const std::string& target, const std::string& data_plane,
               const std::string& bearer_token, double timeout_s) {
    client::ClientOptions options;
    options.timeout = absl::Seconds(timeout_s);
    options.bearer_token = bearer_token;
    if (data_plane == "grpc") {
      options.data_plane = client::ClientOptions::DataPlane::kGrpc;
    } else if (data_plane == "shm") {
      options.data_plane = client::ClientOptions::DataPlane::kShm;
    } else if (data_plane != "auto") {
      throw py::value_error("data_plane: '" + data_plane + "' is not auto, shm or grpc");
    }
    client_ = client::MlaServeClient::Connect(target, options);
  }

  // Whether this client's calls go over the same-host plane (opening it if need be).
  bool on_data_plane() {
    py::gil_scoped_release unlocked;
    return client_->SharedMemoryPlane().ok();
  }

  // The answers into `out` [B, sq, heads, width] (uint16 for bf16 bits, float16 or float32
  // by output_dtype) and `lse` [B, sq, heads] float32, arrays the caller made (through the
  // buffer protocol, which every numpy speaks); returns the DecodePlan messages' bytes.
  py::list DecodeBatch(std::vector<std::string> sequence_ids, int layer,
                       std::optional<py::buffer> q_nope, std::optional<py::buffer> q_pe,
                       std::optional<py::buffer> latent, std::optional<py::buffer> append_rows,
                       std::vector<int64_t> append_positions, int first_head,
                       const std::string& output_dtype, std::optional<float> softmax_scale,
                       py::buffer out, py::buffer lse, std::optional<bool> batch_invariant) {
    client::DecodeBatchRequest request;
    request.sequence_ids = std::move(sequence_ids);
    request.layer = layer;
    request.q_nope = Tensor(q_nope, "q_nope");
    request.q_pe = Tensor(q_pe, "q_pe");
    request.latent = Tensor(latent, "latent");
    request.append_rows = Tensor(append_rows, "append_rows");
    request.append_positions = std::move(append_positions);
    request.first_head = first_head;
    request.output_dtype = OutputDType(output_dtype);
    request.softmax_scale = softmax_scale;
    request.batch_invariant = batch_invariant;
    if (absl::Status checked = client::CheckDecodeBatch(request); !checked.ok()) {
      throw py::value_error(std::string(checked.message()));
    }
    const py::buffer_info out_info = out.request(/*writable=*/true);
    const py::buffer_info lse_info = lse.request(/*writable=*/true);
    if (lse_info.itemsize != sizeof(float)) throw py::value_error("lse: not float32");
    client::DecodeBatchOutput output{
        std::span<std::byte>(static_cast<std::byte*>(out_info.ptr),
                             static_cast<size_t>(out_info.size * out_info.itemsize)),
        std::span<float>(static_cast<float*>(lse_info.ptr), static_cast<size_t>(lse_info.size)),
        {}};
    absl::Status status;
    {
      py::gil_scoped_release unlocked;  // the arrays stay alive: the caller holds them
      status = client_->DecodeBatch(request, output);
    }
    if (!status.ok()) Raise(status);
    py::list plans;
    for (const v1::DecodePlan& plan : output.plans)
      plans.append(py::bytes(plan.SerializeAsString()));
    return plans;
  }

 private:
  std::unique_ptr<client::MlaServeClient> client_;
};

}  // namespace

PYBIND11_MODULE(_native, module) {
  module.doc() = "mlaserve's C++ client, for Client.decode_batch over the data plane";
  py::class_<NativeClient>(module, "NativeClient")
      .def(py::init<const std::string&, const std::string&, const std::string&, double>(),
           py::arg("target"), py::arg("data_plane") = "auto", py::arg("bearer_token") = "",
           py::arg("timeout_s") = 30.0)
      .def("on_data_plane", &NativeClient::on_data_plane)
      .def("decode_batch", &NativeClient::DecodeBatch, py::arg("sequence_ids"), py::arg("layer"),
           py::arg("q_nope") = py::none(), py::arg("q_pe") = py::none(),
           py::arg("latent") = py::none(), py::arg("append_rows") = py::none(),
           py::arg("append_positions") = std::vector<int64_t>{}, py::arg("first_head") = 0,
           py::arg("output_dtype") = "bf16", py::arg("softmax_scale") = py::none(), py::arg("out"),
           py::arg("lse"), py::arg("batch_invariant") = py::none());
}

}  // namespace mlaserve::python
