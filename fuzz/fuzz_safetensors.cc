// libFuzzer target for the safetensors reader: any input must give a header whose tensors lie
// inside the input, or a shardwise::Error. Anything else (a crash, a sanitizer report, another
// exception type) is a bug. Build and run: `make fuzz` (clang; FUZZ_SECONDS=60 by default).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    shardwise::ckpt::StHeader h = shardwise::ckpt::parse_safetensors(bytes, "fuzz.safetensors");
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || h.data_start() + t.end > size) std::abort();
    }
  } catch (const shardwise::Error&) {
  }
  return 0;
}
