// Dense ops of the CPU backend: embedding, norms, GEMM (plain and accumulating), weight column
// scaling, SiLU-and-multiply, row gather. The norm and SiLU-and-multiply also write quantized
// activations (an e4m3 `out` with row scales), which the FP8 GEMM takes as they are.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "core/float8.h"

namespace sieve {

namespace {

void CheckF32Rows(const Tensor& tensor, const char* what) {
  SIEVE_CHECK(tensor.device() == Device::kCpu && tensor.dtype() == DType::kF32 &&
              tensor.rank() == 2 && tensor.stride(1) == 1)
      << what << " must be a 2-D f32 host tensor with contiguous rows, got "
      << tensor.ShapeString();
}

// out [M][N] = x [M][K] w [N][K]^T.
void CheckLinearShapes(const Tensor& x, const Tensor& w, const Tensor& out) {
  SIEVE_CHECK(w.dim(1) == x.dim(1) && out.dim(0) == x.dim(0) && out.dim(1) == w.dim(0))
      << "linear shapes " << x.ShapeString() << " x " << w.ShapeString() << " -> "
      << out.ShapeString();
}

void RmsNormRow(const float* x, const float* weight, float eps, int64_t width, float* out) {
  const float inv_rms = cpu::InvRms(x, width, eps);
  for (int64_t index = 0; index < width; ++index) out[index] = x[index] * inv_rms * weight[index];
}

// A quantized activation (Backend's RmsNorm and SiluMul into an e4m3 `out`): a 2-D e4m3 host
// tensor with contiguous rows and one row scale a row.
void CheckE4m3Rows(const Tensor& tensor, const char* what) {
  SIEVE_CHECK(tensor.device() == Device::kCpu && tensor.dtype() == DType::kF8E4M3 &&
              tensor.rank() == 2 && tensor.stride(1) == 1 && tensor.has_row_scales())
      << what << " must be a 2-D e4m3 host tensor with contiguous rows and row scales, got "
      << tensor.ShapeString();
}

// An op's output rows, f32 or a quantized activation: Row(row) is where the op writes its f32
// row, and Store(row) quantizes it into an e4m3 `out` (QuantizeRowE4m3: what GemmE4m3 would do
// to the f32 row). One per worker: an e4m3 row goes through the worker's scratch.
class OutputRows {
 public:
  OutputRows(Tensor& out, int64_t width)
      : out_(out),
        width_(width),
        scratch_(out.dtype() == DType::kF8E4M3 ? static_cast<size_t>(width) : 0) {}
  float* Row(int64_t row) {
    return scratch_.empty() ? out_.data_as<float>() + row * out_.stride(0) : scratch_.data();
  }
  void Store(int64_t row) {
    if (scratch_.empty()) return;
    out_.row_scales().data_as<float>()[row] =
        QuantizeRowE4m3(scratch_.data(), width_, out_.data_as<uint8_t>() + row * out_.stride(0));
  }

 private:
  Tensor& out_;
  int64_t width_;
  std::vector<float> scratch_;  // [width] f32: the row before quantization
};

// An activation: f32 rows or a quantized activation.
void CheckActivationRows(const Tensor& rows, const char* what) {
  if (rows.dtype() == DType::kF8E4M3) {
    CheckE4m3Rows(rows, what);
  } else {
    CheckF32Rows(rows, what);
  }
}

}  // namespace

void CheckRowRms(const RowRms& norm, int64_t rows, const char* what) {
  if (norm.rows == nullptr) return;
  CheckF32Rows(*norm.rows, "RowRms rows");
  SIEVE_CHECK(norm.rows->dim(0) == rows)
      << what << ": RowRms rows " << norm.rows->ShapeString() << " for " << rows << " rows";
}

float RowRmsScale(const RowRms& norm, int64_t row) {
  if (norm.rows == nullptr) return 1.0f;
  const Tensor& rows = *norm.rows;
  return cpu::InvRms(rows.data_as<float>() + row * rows.stride(0), rows.dim(1), norm.eps);
}

void CpuBackend::Embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  CheckF32Rows(table, "embedding table");
  CheckF32Rows(out, "embedding output");
  const int64_t width = table.dim(1);
  const int64_t vocab = table.dim(0);
  const int32_t* id_data = ids.data_as<int32_t>();
  for (int64_t row = 0; row < ids.numel(); ++row) {
    const int32_t id = id_data[row];
    SIEVE_CHECK(id >= 0 && id < vocab) << "token id " << id << " outside the vocabulary";
    std::memcpy(out.data_as<float>() + row * out.stride(0),
                table.data_as<float>() + id * table.stride(0), width * sizeof(float));
  }
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  CheckF32Rows(x, "rms_norm input");
  CheckActivationRows(out, "rms_norm output");
  const int64_t width = x.dim(1);
  pool_.ParallelFor(x.dim(0), 4, [&](int64_t begin, int64_t end) {
    OutputRows rows(out, width);
    for (int64_t row = begin; row < end; ++row) {
      RmsNormRow(x.data_as<float>() + row * x.stride(0), weight.data_as<float>(), eps, width,
                 rows.Row(row));
      rows.Store(row);
    }
  });
}

void CpuBackend::Linear(const Tensor& x, const Tensor& w, Tensor& out) {
  Gemm(x, w, out, /*accumulate=*/false);
}

void CpuBackend::LinearAdd(const Tensor& x, const Tensor& w, Tensor& out) {
  Gemm(x, w, out, /*accumulate=*/true);
}

void CpuBackend::Gemm(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate) {
  if (w.dtype() == DType::kF8E4M3) {
    GemmE4m3(x, w, out, accumulate);
    return;
  }
  CheckF32Rows(x, "linear input");
  CheckF32Rows(w, "linear weight");
  CheckF32Rows(out, "linear output");
  CheckLinearShapes(x, w, out);
  const int64_t rows = x.dim(0);
  const int64_t inner = x.dim(1);
  const int64_t cols = w.dim(0);
  // Blocks of weight rows stay in cache while every input row passes over them. Each output
  // element is one cpu::Dot over `inner`, whatever the batch and the block it fell in: results
  // don't depend on batch size.
  constexpr int64_t kColBlock = 32;
  constexpr int64_t kRowBlock = 64;
  const int64_t col_blocks = (cols + kColBlock - 1) / kColBlock;
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
  const cpu::Isa isa = cpu::BestIsa();
  pool_.ParallelFor(col_blocks * row_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t col_begin = (block % col_blocks) * kColBlock;
      const int64_t row_begin = (block / col_blocks) * kRowBlock;
      cpu::DotTable(
          isa, cpu::Rows::Strided(x.data_as<float>() + row_begin * x.stride(0), x.stride(0)),
          std::min(kRowBlock, rows - row_begin),
          cpu::Rows::Strided(w.data_as<float>() + col_begin * w.stride(0), w.stride(0)),
          std::min(kColBlock, cols - col_begin), inner,
          out.data_as<float>() + row_begin * out.stride(0) + col_begin, out.stride(0), accumulate);
    }
  });
}

Tensor CpuBackend::QuantizeWeightE4m3(const Tensor& w) {
  CheckF32Rows(w, "quantized weight");
  const int64_t rows = w.dim(0);
  const int64_t cols = w.dim(1);
  Tensor codes = Tensor::Empty({rows, cols}, DType::kF8E4M3);
  Tensor scales = Tensor::Empty({rows}, DType::kF32);
  pool_.ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scales.data_as<float>()[row] = QuantizeRowE4m3(w.data_as<float>() + row * w.stride(0), cols,
                                                     codes.data_as<uint8_t>() + row * cols);
    }
  });
  return codes.WithRowScales(scales);
}

Tensor CpuBackend::UploadWeightE4m3(const uint8_t* codes, const float* row_scales, int64_t rows,
                                    int64_t cols) {
  SIEVE_CHECK(rows > 0 && cols > 0) << "an e4m3 weight of " << rows << " x " << cols;
  Tensor data = Tensor::Empty({rows, cols}, DType::kF8E4M3);
  Tensor scales = Tensor::Empty({rows}, DType::kF32);
  std::memcpy(data.data(), codes, static_cast<size_t>(rows * cols));
  std::memcpy(scales.data(), row_scales, static_cast<size_t>(rows) * sizeof(float));
  return data.WithRowScales(scales);
}

void CpuBackend::GemmE4m3(const Tensor& x, const Tensor& w, Tensor& out, bool accumulate) {
  CheckActivationRows(x, "linear input");
  CheckF32Rows(out, "linear output");
  SIEVE_CHECK(w.device() == Device::kCpu && w.rank() == 2 && w.stride(1) == 1 && w.has_row_scales())
      << "an e4m3 linear weight must be a 2-D host matrix with row scales, got " << w.ShapeString();
  CheckLinearShapes(x, w, out);
  const int64_t rows = x.dim(0);
  const int64_t inner = x.dim(1);
  const int64_t cols = w.dim(0);
  // x's rows as their e4m3 values (unscaled) and each row's scale: quantized here, or as the op
  // that made x quantized them (an e4m3 x with row scales).
  const bool x_quantized = x.dtype() == DType::kF8E4M3;
  std::vector<float> x_values(static_cast<size_t>(rows * inner));
  std::vector<float> x_scales(static_cast<size_t>(rows));
  pool_.ParallelFor(rows, 4, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(static_cast<size_t>(x_quantized ? 0 : inner));
    for (int64_t row = begin; row < end; ++row) {
      const uint8_t* row_codes = codes.data();
      if (x_quantized) {
        row_codes = x.data_as<uint8_t>() + row * x.stride(0);
        x_scales[row] = x.row_scales().data_as<float>()[row];
      } else {
        x_scales[row] =
            QuantizeRowE4m3(x.data_as<float>() + row * x.stride(0), inner, codes.data());
      }
      float* values = x_values.data() + row * inner;
      for (int64_t index = 0; index < inner; ++index) values[index] = E4m3ToFloat(row_codes[index]);
    }
  });
  const float* w_scales = w.row_scales().data_as<float>();
  // As Gemm: each output element is one Dot over `inner`, whatever the batch. A block's weight
  // rows are decoded once into floats (exact: every e4m3 value is a float).
  constexpr int64_t kColBlock = 32;
  const int64_t col_blocks = (cols + kColBlock - 1) / kColBlock;
  pool_.ParallelFor(col_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w_values(static_cast<size_t>(kColBlock * inner));
    for (int64_t block = begin; block < end; ++block) {
      const int64_t col_begin = block * kColBlock;
      const int64_t col_end = std::min(cols, col_begin + kColBlock);
      for (int64_t col = col_begin; col < col_end; ++col) {
        const uint8_t* codes = w.data_as<uint8_t>() + col * w.stride(0);
        float* values = w_values.data() + (col - col_begin) * inner;
        for (int64_t index = 0; index < inner; ++index) values[index] = E4m3ToFloat(codes[index]);
      }
      for (int64_t row = 0; row < rows; ++row) {
        const float* in = x_values.data() + row * inner;
        float* dst = out.data_as<float>() + row * out.stride(0);
        for (int64_t col = col_begin; col < col_end; ++col) {
          const float dot = cpu::Dot(in, w_values.data() + (col - col_begin) * inner, inner);
          const float product = dot * x_scales[row] * w_scales[col];
          dst[col] = accumulate ? dst[col] + product : product;
        }
      }
    }
  });
}

void CpuBackend::ScaleColumns(Tensor& w, const Tensor& scale) {
  CheckF32Rows(w, "scale_columns weight");
  const int64_t cols = w.dim(1);
  SIEVE_CHECK(scale.device() == Device::kCpu && scale.dtype() == DType::kF32 && scale.rank() == 1 &&
              scale.dim(0) == cols)
      << "scale_columns: scale " << scale.ShapeString() << " for weight " << w.ShapeString();
  const float* factors = scale.data_as<float>();
  pool_.ParallelFor(w.dim(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* dst = w.data_as<float>() + row * w.stride(0);
      for (int64_t col = 0; col < cols; ++col) dst[col] *= factors[col];
    }
  });
}

void CpuBackend::SiluMul(const Tensor& gate_up, Tensor& out, RowRms norm) {
  CheckF32Rows(gate_up, "silu_mul input");
  CheckActivationRows(out, "silu_mul output");
  const int64_t width = out.dim(1);
  SIEVE_CHECK(gate_up.dim(1) == 2 * width && gate_up.dim(0) == out.dim(0))
      << "silu_mul shapes " << gate_up.ShapeString() << " -> " << out.ShapeString();
  CheckRowRms(norm, gate_up.dim(0), "silu_mul");
  pool_.ParallelFor(out.dim(0), 4, [&](int64_t begin, int64_t end) {
    OutputRows rows(out, width);
    for (int64_t row = begin; row < end; ++row) {
      const float* gate = gate_up.data_as<float>() + row * gate_up.stride(0);
      const float* up = gate + width;
      float* dst = rows.Row(row);
      if (norm.rows == nullptr) {
        for (int64_t index = 0; index < width; ++index) {
          const float g = gate[index];
          dst[index] = g / (1.0f + std::exp(-g)) * up[index];
        }
      } else {
        // s * gate and s * up in f32, not rounded in between (the act dtype is f32 here anyway).
        const float s = RowRmsScale(norm, row);
        for (int64_t index = 0; index < width; ++index) {
          const float g = s * gate[index];
          dst[index] = g / (1.0f + std::exp(-g)) * (s * up[index]);
        }
      }
      rows.Store(row);
    }
  });
}

void CpuBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) {
  CheckF32Rows(x, "gather input");
  const int64_t width = x.dim(1);
  const int32_t* row_ids = rows.data_as<int32_t>();
  for (int64_t index = 0; index < rows.numel(); ++index) {
    SIEVE_CHECK(row_ids[index] >= 0 && row_ids[index] < x.dim(0));
    std::memcpy(out.data_as<float>() + index * out.stride(0),
                x.data_as<float>() + row_ids[index] * x.stride(0), width * sizeof(float));
  }
}

}  // namespace sieve
