// Fuzzes SafetensorsFile::Open: the 8-byte header length, the JSON header and its tensor table
// (dtype, shape, data_offsets, __metadata__). A file that opens must keep the promise of
// safetensors.h: every tensor's bytes lie inside the mapping and match dtype x shape.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "model/safetensors.h"

namespace {

// One in-memory file for the whole run, rewritten per input: no disk I/O per execution.
int MemoryFile() {
  static const int fd = memfd_create("safetensors_fuzzer", 0);
  SIEVE_CHECK(fd >= 0) << "memfd_create failed";
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = MemoryFile();
  SIEVE_CHECK(ftruncate(fd, 0) == 0);
  for (size_t written = 0; written < size;) {
    const ssize_t count = pwrite(fd, data + written, size - written, static_cast<off_t>(written));
    SIEVE_CHECK(count > 0);
    written += static_cast<size_t>(count);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  sieve::Result<std::unique_ptr<sieve::SafetensorsFile>> file = sieve::SafetensorsFile::Open(path);
  if (!file.ok()) {
    SIEVE_CHECK(!file.status().message().empty());
    return 0;
  }
  // Touch every byte of every tensor: ASan reports a tensor that reaches outside the mapping.
  uint64_t checksum = 0;
  for (const auto& [name, tensor] : (*file)->tensors()) {
    SIEVE_CHECK((*file)->Find(name) == &tensor);
    uint64_t numel = 1;  // Open refused every shape whose product overflows
    for (const int64_t extent : tensor.shape) numel *= static_cast<uint64_t>(extent);
    SIEVE_CHECK(numel * sieve::DTypeSize(tensor.dtype) == tensor.nbytes);
    const auto* bytes = static_cast<const uint8_t*>(tensor.data);
    for (size_t index = 0; index < tensor.nbytes; ++index) checksum += bytes[index];
  }
  // Keeps the reads from being optimised away.
  if (checksum == 0xdeadbeefcafef00dULL) std::abort();
  return 0;
}
