#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/testing.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

// A file of an 8-byte length (the header's, unless `declared_length` is given), the header text,
// then `data_bytes` bytes of 0xab.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes,
              std::optional<uint64_t> declared_length = std::nullopt) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = declared_length.value_or(header.size());
  for (int index = 0; index < 8; ++index)
    out.put(static_cast<char>((length >> (8 * index)) & 0xff));
  out << header;
  out << std::string(data_bytes, '\xab');
}

// `values` converted to `dtype` in a new host tensor.
Tensor Convert(const Tensor& values, DType dtype) {
  Tensor out = Tensor::Empty(values.shape(), dtype);
  ConvertFromFloat(values.data_as<float>(), static_cast<size_t>(values.numel()), dtype, out.data());
  return out;
}

Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

void ExpectError(const Status& status, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

TEST(SafetensorsTest, RoundTripKeepsExactBytes) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  const Tensor values = testing::RandomTensor({7, 5}, rng);
  Tensor ids = Tensor::Empty({3}, DType::kI32);
  for (int index = 0; index < 3; ++index)
    ids.data_as<int32_t>()[index] = static_cast<int32_t>(rng());
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"z.f32", values},
      {"a.bf16", Convert(testing::RandomTensor({3, 11}, rng), DType::kBF16)},
      {"m.f16", Convert(testing::RandomTensor({2, 3, 5}, rng), DType::kF16)},
      {"ids", ids},
      {"empty", Tensor::Empty({0, 4}, DType::kF32)},
      {"scalar", Convert(testing::RandomTensor({}, rng), DType::kBF16)},
  };
  const std::string path = dir.File("round_trip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  // The header is padded so that the data section starts 8-byte aligned.
  std::ifstream raw(path, std::ios::binary);
  uint8_t length_bytes[8];
  raw.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_length = 0;
  for (int index = 7; index >= 0; --index)
    header_length = (header_length << 8) | length_bytes[index];
  EXPECT_EQ(header_length % 8, 0u);

  const Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const SafetensorsTensor* read = (*file)->Find(name);
    ASSERT_NE(read, nullptr) << name;
    EXPECT_EQ(read->name, name);
    EXPECT_EQ(read->dtype, tensor.dtype()) << name;
    EXPECT_EQ(read->shape, tensor.shape()) << name;
    ASSERT_EQ(read->nbytes, tensor.nbytes()) << name;
    EXPECT_EQ(std::memcmp(read->data, tensor.data(), tensor.nbytes()), 0) << name;
  }
  // Tensors lie in the order given, the first at the aligned start of the data section.
  const SafetensorsTensor* first = (*file)->Find("z.f32");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first->data) % 8, 0u);
  EXPECT_LT(first->data, (*file)->Find("a.bf16")->data);
  EXPECT_LT((*file)->Find("a.bf16")->data, (*file)->Find("m.f16")->data);
  EXPECT_EQ((*file)->Find("nope"), nullptr);
}

TEST(SafetensorsTest, ReadsUnalignedOffsetsAndUnpaddedHeaders) {
  TempDir dir;
  const std::string path = dir.File("unaligned.safetensors");
  // No padding, and a 2-byte tensor before a 4-byte one: neither starts aligned.
  const std::string header = R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[3,7]}})";
  WriteRaw(path, header, 7);
  const Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsTensor* b = (*file)->Find("b");
  ASSERT_NE(b, nullptr);
  uint32_t bits;
  std::memcpy(&bits, b->data, sizeof(bits));
  EXPECT_EQ(bits, 0xababababu);
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(SafetensorsTest, RejectsTruncatedFiles) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  const std::string path = dir.File("truncated.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"first", testing::RandomTensor({4}, rng)},
                                      {"last", testing::RandomTensor({4}, rng)}})
                  .ok());
  fs::resize_file(path, fs::file_size(path) - 1);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'last'", "beyond"});

  fs::resize_file(path, 5);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "too short"});
  fs::resize_file(path, 0);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "0 bytes"});
}

TEST(SafetensorsTest, RejectsBadHeaderLengths) {
  TempDir dir;
  const std::string path = dir.File("length.safetensors");
  WriteRaw(path, "{}", 0, uint64_t{1} << 40);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "exceeds the limit"});
  WriteRaw(path, "{}", 0, 1000);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "runs past the end"});
}

TEST(SafetensorsTest, RejectsHeadersThatAreNotJsonObjects) {
  TempDir dir;
  const std::string path = dir.File("header.safetensors");
  WriteRaw(path, "not json at all", 0);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "not valid JSON"});
  WriteRaw(path, "[1, 2]  ", 0);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "must be a JSON object"});
  WriteRaw(path, R"({"__metadata__": {"format": 1}})", 0);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'format'"});
}

TEST(SafetensorsTest, RejectsBadTensorEntries) {
  TempDir dir;
  const std::string path = dir.File("entries.safetensors");
  struct Case {
    std::string header;
    size_t data_bytes;
    StatusCode code;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "beyond the 8-byte data section"}},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "spans 8 bytes", "[3]", "needs 12"}},
      {R"({"w":{"dtype":"Q9","shape":[2],"data_offsets":[0,2]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "unknown dtype 'Q9'"}},
      {R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
       8,
       StatusCode::kUnimplemented,
       {"'w'", "F64"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       16,
       StatusCode::kDataLoss,
       {"'a'", "'b'", "overlap"}},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "bad shape"}},
      {R"({"w":{"dtype":"U8","shape":[4611686018427387904,4611686018427387904],)"
       R"("data_offsets":[0,0]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "more than 2^64"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "bad data_offsets"}},
      {R"({"w":{"dtype":"F32","shape":[1]}})", 8, StatusCode::kDataLoss, {"'w'", "data_offsets"}},
      {R"({"w":[1, 2]})", 8, StatusCode::kDataLoss, {"'w'", "must be an object"}},
  };
  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.header);
    WriteRaw(path, test_case.header, test_case.data_bytes);
    const Status status = OpenStatus(path);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), test_case.code) << status.ToString();
    EXPECT_NE(status.message().find(path), std::string::npos) << status.message();
    for (const std::string& part : test_case.parts) {
      EXPECT_NE(status.message().find(part), std::string::npos)
          << "'" << part << "' not in: " << status.message();
    }
  }
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  TempDir dir;
  ExpectError(OpenStatus(dir.File("nope.safetensors")), StatusCode::kNotFound, {"nope"});
}

TEST(SafetensorsTest, WriteRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  const Tensor matrix = Tensor::Empty({4, 4}, DType::kF32);
  ExpectError(WriteSafetensors(path, {{"a", matrix}, {"a", matrix}}), StatusCode::kInvalidArgument,
              {"'a'", "twice"});
  ExpectError(WriteSafetensors(path, {{"view", matrix.Columns(1, 3)}}),
              StatusCode::kInvalidArgument, {"'view'", "contiguous"});
  ExpectError(WriteSafetensors(path, {{"undefined", Tensor()}}), StatusCode::kInvalidArgument,
              {"'undefined'"});
  ExpectError(WriteSafetensors(path, {{"__metadata__", matrix}}), StatusCode::kInvalidArgument,
              {"__metadata__"});
  EXPECT_FALSE(fs::exists(path));
}

TEST(SafetensorsCheckpointTest, OpensSingleFile) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  const Tensor weight = Convert(testing::RandomTensor({8, 4}, rng), DType::kBF16);
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model.safetensors"),
                       {{"b.weight", weight}, {"a.weight", testing::RandomTensor({4}, rng)}})
          .ok());
  const Result<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ((*checkpoint)->Names(), (std::vector<std::string>{"a.weight", "b.weight"}));
  const SafetensorsTensor* read = (*checkpoint)->Find("b.weight");
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(std::memcmp(read->data, weight.data(), weight.nbytes()), 0);
  EXPECT_EQ((*checkpoint)->FileOf("b.weight")->path(), dir.File("model.safetensors"));
  EXPECT_EQ((*checkpoint)->Find("c.weight"), nullptr);
  EXPECT_EQ((*checkpoint)->TotalBytes(), 8 * 4 * 2 + 4 * 4u);
}

// Writes two shards and the index that maps `tensors` to them, alternating.
void WriteShardedCheckpoint(const TempDir& dir,
                            const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::pair<std::string, Tensor>> shards[2];
  nlohmann::json weight_map = nlohmann::json::object();
  const std::string names[2] = {"model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors"};
  for (size_t index = 0; index < tensors.size(); ++index) {
    shards[index % 2].push_back(tensors[index]);
    weight_map[tensors[index].first] = names[index % 2];
  }
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(WriteSafetensors(dir.File(names[shard]), shards[shard]).ok());
  }
  const nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream(dir.File("model.safetensors.index.json")) << index.dump(2);
}

TEST(SafetensorsCheckpointTest, OpensShardedIndex) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int index = 0; index < 5; ++index) {
    tensors.emplace_back("layer." + std::to_string(index),
                         Convert(testing::RandomTensor({3, index + 1}, rng), DType::kF16));
  }
  WriteShardedCheckpoint(dir, tensors);
  const Result<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ((*checkpoint)->Names().size(), 5u);
  for (size_t index = 0; index < tensors.size(); ++index) {
    const auto& [name, tensor] = tensors[index];
    const SafetensorsTensor* read = (*checkpoint)->Find(name);
    ASSERT_NE(read, nullptr) << name;
    EXPECT_EQ(read->shape, tensor.shape());
    EXPECT_EQ(std::memcmp(read->data, tensor.data(), tensor.nbytes()), 0) << name;
    EXPECT_NE((*checkpoint)->FileOf(name)->path().find(index % 2 == 0 ? "00001" : "00002"),
              std::string::npos);
  }
}

TEST(SafetensorsCheckpointTest, ShardedErrorsNameTheShardAndTensor) {
  TempDir dir;
  std::mt19937_64 rng = testing::MakeRng();
  WriteShardedCheckpoint(
      dir, {{"a", testing::RandomTensor({2}, rng)}, {"b", testing::RandomTensor({2}, rng)}});
  const std::string index_path = dir.File("model.safetensors.index.json");

  // A tensor the index lists but its shard lacks.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";
  std::ofstream(index_path) << index.dump();
  ExpectError(SafetensorsCheckpoint::Open(dir.path()).status(), StatusCode::kDataLoss,
              {"'ghost'", "model-00001-of-00002.safetensors"});

  // A shard that is not there.
  index["weight_map"].erase("ghost");
  index["weight_map"]["c"] = "model-00003-of-00003.safetensors";
  std::ofstream(index_path) << index.dump();
  ExpectError(SafetensorsCheckpoint::Open(dir.path()).status(), StatusCode::kNotFound,
              {"model-00003-of-00003.safetensors", "'c'"});

  // A shard outside the directory.
  index["weight_map"]["c"] = "../elsewhere.safetensors";
  std::ofstream(index_path) << index.dump();
  ExpectError(SafetensorsCheckpoint::Open(dir.path()).status(), StatusCode::kDataLoss,
              {"'c'", "../elsewhere.safetensors"});

  std::ofstream(index_path) << R"({"metadata": {}})";
  ExpectError(SafetensorsCheckpoint::Open(dir.path()).status(), StatusCode::kDataLoss,
              {"weight_map"});
}

TEST(SafetensorsCheckpointTest, NoWeightsIsNotFound) {
  TempDir dir;
  ExpectError(SafetensorsCheckpoint::Open(dir.path()).status(), StatusCode::kNotFound,
              {"model.safetensors", "model.safetensors.index.json", dir.path()});
  ASSERT_TRUE(WriteSafetensors(dir.File("consolidated.safetensors"), {}).ok());
  ExpectError(SafetensorsCheckpoint::Open(dir.path()).status(), StatusCode::kNotFound,
              {"consolidated.safetensors"});
  ExpectError(SafetensorsCheckpoint::Open(dir.File("nope")).status(), StatusCode::kNotFound,
              {"nope"});
}

}  // namespace
}  // namespace sieve
