// Safetensors: reading model weights through a read-only memory map, and writing small files.
//
// A .safetensors file is 8 bytes of little-endian header length N, N bytes of JSON header, then
// the data section. The header maps each tensor name to {dtype, shape, data_offsets [begin, end)}
// (offsets relative to the data section) and may carry "__metadata__", a map of strings.
//
// SafetensorsFile checks the whole header at Open, so that a truncated or corrupt file is a
// DataLoss error naming the file and the tensor, never a crash later: every tensor's bytes lie
// inside the file, match its dtype and shape, and overlap no other tensor's. Data pointers point
// into the mapping and live as long as the SafetensorsFile. They need not be aligned (the format
// does not require it; files written by WriteSafetensors are 8-byte aligned).
//
// SafetensorsCheckpoint is a model directory's weights: `model.safetensors`, or the shards that
// `model.safetensors.index.json` names, each mapped once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace sieve {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // [nbytes] in the file's mapping; not necessarily aligned
  size_t nbytes = 0;
};

// The safetensors spelling of a dtype: "F32", "BF16", ...
std::string_view SafetensorsDTypeName(DType dtype);

class SafetensorsFile {
 public:
  // Maps and validates `path`. NotFound when it does not exist; DataLoss when it is corrupt;
  // Unimplemented for a tensor of a dtype Sieve does not read (F64, I8, F8_E5M2, ...).
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when the file has no such tensor.
  const SafetensorsTensor* Find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  Status ParseHeader(const uint8_t* bytes, size_t size);

  std::string path_;
  void* mapping_ = nullptr;  // [mapping_size_] bytes, PROT_READ; null for an empty mapping
  size_t mapping_size_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsCheckpoint {
 public:
  // Opens `<model_dir>/model.safetensors`, else the shards listed in
  // `<model_dir>/model.safetensors.index.json` (its weight_map is the list of tensors: a tensor
  // it names must be in its shard). NotFound when the directory has neither.
  static Result<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& model_dir);

  // nullptr when the checkpoint has no such tensor.
  const SafetensorsTensor* Find(std::string_view name) const;
  // The file that holds `name` (for messages); nullptr when absent.
  const SafetensorsFile* FileOf(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> Names() const;
  const std::string& dir() const { return dir_; }
  // Bytes of all tensors together.
  size_t TotalBytes() const;

 private:
  struct Entry {
    const SafetensorsTensor* tensor;
    const SafetensorsFile* file;
  };

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // one per shard
  std::map<std::string, Entry, std::less<>> entries_;    // points into files_
};

// Writes host tensors (contiguous, any dtype) to `path` in the standard format: the header padded
// with spaces to a multiple of 8 bytes, then the tensors' bytes in the given order. The file
// appears complete or not at all (written beside it, then renamed).
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace sieve
