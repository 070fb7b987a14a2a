#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "model/model_config.h"

namespace sieve {
namespace {

using nlohmann::json;

// What the reference implementation accepts as a header; a longer one is corruption.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kSingleFileName = "model.safetensors";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

std::string Quote(std::string_view text) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "'" + std::string(text).
  std::string out;
  out.reserve(text.size() + 2);
  out += '\'';
  out += text;
  out += '\'';
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t index = 0; index < shape.size(); ++index) {
    if (index > 0) out += ", ";
    out += std::to_string(shape[index]);
  }
  return out + "]";
}

std::optional<DType> SupportedDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  if (name == "F8_E4M3") return DType::kF8E4M3;  // FP8 checkpoints' weights (model/README.md)
  return std::nullopt;
}

// Valid safetensors dtypes that Sieve has no use for: a clear Unimplemented, not "corrupt".
bool IsKnownUnsupportedDType(std::string_view name) {
  static constexpr std::string_view kNames[] = {"BOOL",    "I8",  "I16",     "U16",     "U32",
                                                "U64",     "F64", "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                                "F6_E3M2", "F4",  "C64"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

// A non-negative JSON integer (nlohmann parses those as unsigned).
std::optional<uint64_t> AsUnsigned(const json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<uint64_t>();
}

std::string Describe(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 60) + "...";
  return text;
}

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

std::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

// ----------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(path + " does not exist");
    return InternalError("cannot open " + path + ": " + ErrnoText());
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const std::string reason = ErrnoText();
    ::close(fd);
    return InternalError("cannot stat " + path + ": " + reason);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + " is not a regular file");
  }
  const auto size = static_cast<size_t>(info.st_size);
  if (size < 8) {
    ::close(fd);
    return DataLossError(path + ": file is " + std::to_string(size) +
                         " bytes, too short for the 8-byte header length of a safetensors file");
  }
  void* mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_error = mapping == MAP_FAILED ? ErrnoText() : "";
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
  if (mapping == MAP_FAILED) return InternalError("cannot mmap " + path + ": " + map_error);

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  SIEVE_RETURN_IF_ERROR(file->ParseHeader(static_cast<const uint8_t*>(mapping), size));
  return file;
}

Status SafetensorsFile::ParseHeader(const uint8_t* bytes, size_t size) {
  uint64_t header_bytes = 0;
  for (int index = 7; index >= 0; --index) header_bytes = (header_bytes << 8) | bytes[index];
  if (header_bytes > kMaxHeaderBytes) {
    return DataLossError(path_ + ": header length " + std::to_string(header_bytes) +
                         " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
                         " bytes (not a safetensors file, or corrupt)");
  }
  if (header_bytes > size - 8) {
    return DataLossError(path_ + ": header length " + std::to_string(header_bytes) +
                         " runs past the end of the " + std::to_string(size) +
                         "-byte file (truncated?)");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_bytes);
  } catch (const json::exception& e) {
    return DataLossError(path_ + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) {
    return DataLossError(path_ + ": header must be a JSON object, got " +
                         std::string(header.type_name()));
  }

  const uint8_t* data = bytes + 8 + header_bytes;  // [data_bytes]
  const uint64_t data_bytes = size - 8 - header_bytes;
  // (begin, end, name) of every non-empty tensor, to find overlaps.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> extents;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return DataLossError(path_ + ": __metadata__ must be an object of strings, got " +
                             Describe(entry));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return DataLossError(path_ + ": __metadata__ entry " + Quote(key) +
                               " must be a string, got " + Describe(value));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = path_ + ": tensor " + Quote(name);
    if (!entry.is_object())
      return DataLossError(where + " must be an object, got " + Describe(entry));

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return DataLossError(where + " has no dtype string");
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    const std::optional<DType> dtype = SupportedDType(dtype_name);
    if (!dtype) {
      if (IsKnownUnsupportedDType(dtype_name)) {
        return UnimplementedError(where + " has dtype " + dtype_name +
                                  ", which Sieve does not read (it reads F32, BF16, F16, I32, "
                                  "I64, U8, F8_E4M3)");
      }
      return DataLossError(where + " has unknown dtype " + Quote(dtype_name));
    }

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return DataLossError(where + " has no shape list");
    }
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.dtype = *dtype;
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& extent_json : *shape_it) {
      const std::optional<uint64_t> extent = AsUnsigned(extent_json);
      if (!extent || *extent > static_cast<uint64_t>(INT64_MAX)) {
        return DataLossError(where + " has a bad shape " + Describe(*shape_it));
      }
      tensor.shape.push_back(static_cast<int64_t>(*extent));
      overflow = overflow || __builtin_mul_overflow(numel, *extent, &numel);
    }
    uint64_t expected_bytes = 0;
    overflow = overflow || __builtin_mul_overflow(numel, DTypeSize(*dtype), &expected_bytes);

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return DataLossError(where + " has no data_offsets [begin, end]");
    }
    const std::optional<uint64_t> begin = AsUnsigned((*offsets_it)[0]);
    const std::optional<uint64_t> end = AsUnsigned((*offsets_it)[1]);
    if (!begin || !end || *begin > *end) {
      return DataLossError(where + " has bad data_offsets " + Describe(*offsets_it));
    }
    if (*end > data_bytes) {
      return DataLossError(where + " has data_offsets [" + std::to_string(*begin) + ", " +
                           std::to_string(*end) + "] beyond the " + std::to_string(data_bytes) +
                           "-byte data section (truncated file?)");
    }
    if (overflow || *end - *begin != expected_bytes) {
      return DataLossError(
          where + " spans " + std::to_string(*end - *begin) + " bytes, but its shape " +
          ShapeString(tensor.shape) + " of " + dtype_name + " needs " +
          (overflow ? std::string("more than 2^64") : std::to_string(expected_bytes)));
    }
    tensor.data = data + *begin;
    tensor.nbytes = static_cast<size_t>(expected_bytes);
    if (tensor.nbytes > 0) extents.emplace_back(*begin, *end, name);
    tensors_.emplace(name, std::move(tensor));
  }

  std::sort(extents.begin(), extents.end());
  for (size_t index = 1; index < extents.size(); ++index) {
    const auto& [previous_begin, previous_end, previous_name] = extents[index - 1];
    const auto& [begin, end, name] = extents[index];
    if (begin < previous_end) {
      return DataLossError(path_ + ": tensors " + Quote(previous_name) + " [" +
                           std::to_string(previous_begin) + ", " + std::to_string(previous_end) +
                           ") and " + Quote(name) + " [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") overlap");
    }
  }
  return Status::Ok();
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  const auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

// ----------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

Result<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(model_dir, error)) {
    return NotFoundError("model directory " + model_dir + " does not exist");
  }
  std::unique_ptr<SafetensorsCheckpoint> checkpoint(new SafetensorsCheckpoint());
  checkpoint->dir_ = model_dir;

  // transformers prefers the single file when both exist; so does Sieve.
  const fs::path single_path = fs::path(model_dir) / kSingleFileName;
  if (fs::exists(single_path, error)) {
    SIEVE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                           SafetensorsFile::Open(single_path.string()));
    for (const auto& [name, tensor] : file->tensors()) {
      checkpoint->entries_.emplace(name, Entry{&tensor, file.get()});
    }
    checkpoint->files_.push_back(std::move(file));
    return checkpoint;
  }

  const fs::path index_path = fs::path(model_dir) / kIndexFileName;
  if (!fs::exists(index_path, error)) {
    std::string others;
    for (const auto& item : fs::directory_iterator(model_dir, error)) {
      if (item.path().extension() == ".safetensors") {
        others += (others.empty() ? "" : ", ") + item.path().filename().string();
      }
    }
    return NotFoundError(
        "no " + std::string(kSingleFileName) + " or " + std::string(kIndexFileName) + " in " +
        model_dir +
        (others.empty() ? std::string()
                        : " (found " + others + ", but Sieve reads the Hugging Face layout)"));
  }

  const std::string index_name = index_path.string();
  SIEVE_ASSIGN_OR_RETURN(const json index, ReadJsonFile(index_name));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return DataLossError(index_name + ": expected an object with a \"weight_map\" object");
  }
  // shard file name -> the tensors the index puts there
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, shard_json] : index["weight_map"].items()) {
    if (!shard_json.is_string()) {
      return DataLossError(index_name + ": weight_map entry " + Quote(name) +
                           " must name a shard file, got " + Describe(shard_json));
    }
    const std::string shard = shard_json.get<std::string>();
    // Shards live beside the index; a path that leaves the directory is not a checkpoint's.
    const fs::path shard_path(shard);
    if (shard.empty() || shard_path.is_absolute() ||
        std::find(shard_path.begin(), shard_path.end(), fs::path("..")) != shard_path.end()) {
      return DataLossError(index_name + ": tensor " + Quote(name) + " has a bad shard path " +
                           Quote(shard));
    }
    shards[shard].push_back(name);
  }
  for (const auto& [shard, names] : shards) {
    const std::string shard_path = (fs::path(model_dir) / shard).string();
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
    if (!file.ok()) {
      if (file.status().code() == StatusCode::kNotFound) {
        return NotFoundError("shard " + shard_path + " listed in " + index_name + " (for " +
                             std::to_string(names.size()) + " tensors, e.g. " +
                             Quote(names.front()) + ") does not exist");
      }
      return file.status();
    }
    for (const std::string& name : names) {
      const SafetensorsTensor* tensor = (*file)->Find(name);
      if (tensor == nullptr) {
        return DataLossError("tensor " + Quote(name) + " is listed in " + index_name +
                             " under shard " + shard + ", but " + shard_path +
                             " does not contain it");
      }
      checkpoint->entries_.emplace(name, Entry{tensor, file->get()});
    }
    checkpoint->files_.push_back(std::move(*file));
  }
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::Find(std::string_view name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.tensor;
}

const SafetensorsFile* SafetensorsCheckpoint::FileOf(std::string_view name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.file;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

size_t SafetensorsCheckpoint::TotalBytes() const {
  size_t total = 0;
  for (const auto& [name, entry] : entries_) total += entry.tensor->nbytes;
  return total;
}

// ----------------------------------------------------------------------------------------------
// WriteSafetensors

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string where = path + ": tensor " + Quote(name);
    if (name.empty() || name == "__metadata__")
      return InvalidArgumentError(where + " is not a valid name");
    if (!seen.insert(name).second) return InvalidArgumentError(where + " appears twice");
    if (!tensor.defined() || tensor.device() != Device::kCpu || !tensor.is_contiguous()) {
      return InvalidArgumentError(where + " must be a defined, contiguous host tensor, got " +
                                  (tensor.defined() ? tensor.ShapeString() : "undefined"));
    }
    const uint64_t end = offset + tensor.nbytes();
    header[name] = {{"dtype", std::string(SafetensorsDTypeName(tensor.dtype()))},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": cannot encode the header: " + e.what());
  }
  // Pad with spaces so that the data section starts 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const std::string temp_path = path + ".tmp";
  {
    std::ofstream out(temp_path, std::ios::binary | std::ios::trunc);
    if (!out) return InternalError("cannot create " + temp_path + ": " + ErrnoText());
    uint8_t length[8];
    for (int index = 0; index < 8; ++index) {
      length[index] =
          static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * index));
    }
    out.write(reinterpret_cast<const char*>(length), sizeof(length));
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const auto& [name, tensor] : tensors) {
      out.write(static_cast<const char*>(tensor.data()),
                static_cast<std::streamsize>(tensor.nbytes()));
    }
    out.close();
    if (!out) {
      std::remove(temp_path.c_str());
      return InternalError("cannot write " + temp_path + ": " + ErrnoText());
    }
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) {
    const std::string reason = ErrnoText();
    std::remove(temp_path.c_str());
    return InternalError("cannot rename " + temp_path + " to " + path + ": " + reason);
  }
  return Status::Ok();
}

}  // namespace sieve
