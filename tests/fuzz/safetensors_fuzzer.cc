// Safetensors files: the header parser and its checks, then the model loader reading the
// small model's up-projections from whatever the file holds.

#include <cstddef>
#include <cstdint>

#include "server/engine/model/model_weights.h"
#include "server/engine/model/safetensors.h"
#include "tests/fuzz/memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const mlaserve::fuzz::MemoryFile file(data, size);
  auto opened = mlaserve::engine::SafetensorsFile::Open(file.path());
  if (opened.ok()) {
    // Every tensor's bytes are readable where the header says.
    volatile uint8_t sink = 0;
    for (const auto& [name, info] : opened->tensors()) {
      for (const std::byte b : opened->Data(info)) sink = sink ^ static_cast<uint8_t>(b);
    }
  }
  mlaserve::engine::ModelConfig model;
  model.name = "fuzz";
  model.heads = 2;
  model.layers = 1;
  model.softmax_scale = 0.1f;
  mlaserve::engine::ModelWeights::FromSafetensors(model, file.path()).IgnoreError();
  return 0;
}
