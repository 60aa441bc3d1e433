#pragma once
// A measured GEMM kernel table: times of one GPU and one dtype on a dense (m, n, k) grid
// (format dtsim-gemm-table-1, models/calibration/tables/README.md), and the GEMM tables
// dtsim ships for its GPU presets (NVIDIA aiconfigurator data, Apache-2.0; source, commit
// and changes in that README).
//
// Lookup of an m x n x k GEMM (GemmTable::lookup), in microseconds converted to seconds:
//  - every dimension on the grid: the measured point (TimeSource::table_exact);
//  - inside the grid: trilinear interpolation between the 8 measured corners of the cell, in
//    m, n and k themselves (TimeSource::table_interpolated). A GEMM's time is close to
//    a + c m n k on a cell, which trilinear interpolation reproduces exactly;
//  - outside the grid (TimeSource::table_extrapolated, "the shape is outside the table"):
//    a dimension above the largest grid value is looked up at that value and the time
//    scaled by dimension / largest (full waves: the work, and the time, grow linearly in
//    each dimension; NVIDIA "Matrix Multiplication Background User's Guide", "Math and
//    Memory Bounds": arithmetic 2mnk at a fixed rate once the GPU is full); a dimension
//    below the smallest (n or k < 32) is looked up at the smallest: a kernel that small is
//    bound by its fixed cost, which a smaller shape does not reduce;
//  - nothing when a corner the lookup needs was not measured (the caller uses the roofline).
//
// Layout rule for backward GEMMs: the tables hold the NT forward Y = X W^T only. An input
// gradient dX = dY W (NN) and a weight gradient dW = dY^T X (TN) of the same (m, n, k) are
// timed as the NT GEMM of that (m, n, k): cuBLAS runs all three layouts on the same tensor-
// core tiles, and the FLOPs, 2mnk, are the same (NVIDIA cuBLAS documentation, cublasLtMatmul:
// the transposes only change how operands are read). Not modelled: the wgrad's fp32
// main_grad accumulation (Megatron-Core gradient_accumulation_fusion) and its epilogue.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/calibration/kernel_spec.hpp"
#include "models/calibration/profile.hpp"

namespace dtsim::calib {

class GemmTable {
 public:
  std::string name;        // "h100_sxm_gemm_bf16" (shipped) or the file it was read from
  std::string system;      // "h100_sxm"
  std::string device;      // "NVIDIA H100 80GB HBM3"
  std::string collection;  // "VLLM 0.24.0, kernel torch.nn.functional.linear"
  Dtype dtype = Dtype::bf16;
  std::vector<int64_t> ms, ns, ks;  // grid axes, ascending, elements
  /// Times in seconds, index (im * ns.size() + in) * ks.size() + ik; < 0 = not measured.
  std::vector<double> seconds;

  /// Parses format dtsim-gemm-table-1. Throws InputError naming `file`, the line and the
  /// violated rule (unknown key, axis not ascending positive integers, wrong number of
  /// rows or values, a time that is not a positive number or "-").
  static GemmTable parse(std::string_view text, const std::string& file);

  /// The time of an m x n x k GEMM (rules in the header comment); nullopt when a needed grid
  /// point is missing or a dimension is not positive.
  std::optional<ProfileTime> lookup(const GemmShape& g) const;

  /// The measured point at grid indices (im, in, ik), seconds (< 0: not measured).
  double at(size_t im, size_t in, size_t ik) const { return seconds[(im * ns.size() + in) * ks.size() + ik]; }
};

/// The shipped table of `system` ("h100_sxm") for `dtype`, parsed once per process
/// (thread-safe); nullptr when dtsim ships none (A100 has no fp8 table).
const GemmTable* shipped_gemm_table(std::string_view system, Dtype dtype);

/// Systems with at least one shipped GEMM table, sorted: a100_sxm, b200_sxm, h100_sxm, h200_sxm.
std::vector<std::string> shipped_table_systems();

}  // namespace dtsim::calib
