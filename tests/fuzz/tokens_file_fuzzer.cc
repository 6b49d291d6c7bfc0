// The tenants' tokens file (--auth_tokens_file): its JSON and every entry's checks.

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"
#include "server/service/tenancy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto tenancy = mlaserve::service::Tenancy::FromTokensFile(text, "fuzz.json", {16});
  if (tenancy.ok()) (*tenancy)->KvQuotas();
  return 0;
}
