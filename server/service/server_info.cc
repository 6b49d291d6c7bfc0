#include "server/service/server_info.h"

#include "absl/time/time.h"
#include "server/service/kv_request_codec.h"

namespace mlaserve::service {

v1::GetServerInfoResponse MakeServerInfo(const engine::EngineInfo& info,
                                         int64_t max_message_bytes) {
  v1::GetServerInfoResponse response;
  response.set_server_version(MLASERVE_VERSION);
  v1::ModelInfo* model = response.mutable_model();
  model->set_name(info.model.name);
  model->set_heads(info.model.heads);
  model->set_dn(info.model.dn);
  model->set_dr(info.model.dr);
  model->set_dl(info.model.dl);
  model->set_dv(info.model.dv);
  model->set_layers(info.model.layers);
  model->set_softmax_scale(info.model.softmax_scale);
  model->set_kv_dtype(v1::DTYPE_BF16);
  model->set_kv_row_width(info.model.dk_latent());
  response.set_page_size(info.page_size);
  response.set_batch_invariant(info.batch_invariant);
  for (std::size_t i = 0; i < info.devices.size(); ++i) {
    v1::DeviceInfo* device = response.add_devices();
    device->set_index(static_cast<int>(i));
    device->set_profile(info.devices[i].profile);
    device->set_host_threads(info.devices[i].host_threads);
    device->set_matrix_tflops(info.devices[i].matrix_tflops);
    device->set_hbm_tbps(info.devices[i].hbm_tbps);
    device->set_kind(info.devices[i].kind);
    device->set_description(info.devices[i].description);
    device->set_memory_bytes(info.devices[i].memory_bytes);
  }
  for (std::size_t i = 0; i < info.b_theta_by_sq.size(); ++i) {
    v1::NaiveThreshold* threshold = response.add_naive_thresholds();
    threshold->set_sq(static_cast<int>(i) + 1);
    threshold->set_b_theta(info.b_theta_by_sq[i]);
  }
  for (std::size_t i = 0; i < info.fp8_b_theta_by_sq.size(); ++i) {
    v1::NaiveThreshold* threshold = response.add_fp8_naive_thresholds();
    threshold->set_sq(static_cast<int>(i) + 1);
    threshold->set_b_theta(info.fp8_b_theta_by_sq[i]);
  }
  for (const KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    v1::KvFormat* format = response.add_kv_formats();
    format->set_dtype(ToWire(dtype));
    format->set_bytes_per_token(LatentBytesPerToken(dtype, info.model.dl, info.model.dr));
    format->set_page_tokens(dtype == KvDtype::kBf16 ? info.page_size : info.fp8_page_tokens);
  }
  response.set_default_kv_dtype(ToWire(info.default_kv_dtype));
  v1::Limits* limits = response.mutable_limits();
  limits->set_max_batch(info.max_batch);
  limits->set_max_sq(info.max_sq);
  limits->set_max_queue(info.max_queue);
  limits->set_max_wait_us(absl::ToInt64Microseconds(info.max_wait));
  limits->set_kv_budget_bytes(info.kv_budget_bytes);
  limits->set_max_message_bytes(max_message_bytes);
  v1::HostInfo* host = response.mutable_host();
  host->set_cpu_model(info.host.cpu_model);
  host->set_logical_cores(info.host.logical_cores);
  host->set_isa(info.host.isa);
  host->set_matrix_unit(info.host.matrix_unit);
  host->set_usable_cpus(info.host.sizing.usable_cpus);
  host->set_cpu_quota(info.host.sizing.cpu_quota);
  host->set_numa_nodes(info.host.sizing.numa_nodes);
  host->set_pool_sizing(info.host.sizing.rule);
  return response;
}

}  // namespace mlaserve::service
