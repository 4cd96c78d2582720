#pragma once
// Independent references for issue 20's published checks: formulas and
// figures copied from the ZeRO papers and from DeepSpeed's own source, NOT
// derived from frugal's planner. A check compares what frugal plans with
// these; if both came from one derivation, a shared mistake would pass.
//
// Each figure says where it is printed. "unconfirmed" marks a figure I could
// not read in its source; do not build a check on one until it is.
#include <algorithm>
#include <cstdint>

namespace frugal::published {

// ---------------------------------------------------------------------------
// ZeRO: Rajbhandari, Rasley, Ruwase, He. "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", SC'20, arXiv 1910.02054 (v3).
// Section 5 (Figure 1 and Table 1): model-state bytes per GPU of a model of
// psi parameters in mixed-precision Adam training over N data-parallel GPUs,
// K = 12 bytes of optimizer state per parameter (fp32 master weights,
// momentum and variance; Section 3.1), fp16 parameters and gradients 2 bytes
// each.
namespace zero {

inline constexpr double kK = 12;

inline double baseline_bytes(double psi) { return (2 + 2 + kK) * psi; }
// P_os: optimizer states partitioned.
inline double pos_bytes(double psi, double n) { return 4 * psi + kK * psi / n; }
// P_os+g: optimizer states and gradients partitioned.
inline double pos_g_bytes(double psi, double n) { return 2 * psi + (2 + kK) * psi / n; }
// P_os+g+p: all three partitioned.
inline double pos_g_p_bytes(double psi, double n) { return (4 + kK) * psi / n; }

// Table 1, "Per-device memory consumption of different optimizations in
// ZeRO-DP as a function of DP degree", in GB (1e9 bytes: 16 * 7.5e9 bytes
// is the table's 120). `decimals` is how many the table prints: its figures
// are rounded (35.6 for 35.625) or cut (4187 for 4187.5, 2218 for 2218.75)
// to that many, so a check accepts either.
struct Table1Row {
  double psi;        // parameters
  int dp;            // N, the data-parallel degree
  double pos_gb, pos_g_gb, pos_g_p_gb;
  int pos_dec, pos_g_dec, pos_g_p_dec;
};
// Copied from the table (arXiv 1910.02054v3, page 11). Columns: P_os, P_os+g,
// P_os+g+p for 7.5B, 128B and 1T parameters; rows N = 1, 4, 16, 64, 256, 1024.
inline constexpr Table1Row kTable1[] = {
    {7.5e9, 1, 120, 120, 120, 0, 0, 0},
    {7.5e9, 4, 52.5, 41.3, 30, 1, 1, 0},
    {7.5e9, 16, 35.6, 21.6, 7.5, 1, 1, 1},
    {7.5e9, 64, 31.4, 16.6, 1.88, 1, 1, 2},
    {7.5e9, 256, 30.4, 15.4, 0.47, 1, 1, 2},
    {7.5e9, 1024, 30.1, 15.1, 0.12, 1, 1, 2},
    {128e9, 1, 2048, 2048, 2048, 0, 0, 0},
    {128e9, 4, 896, 704, 512, 0, 0, 0},
    {128e9, 16, 608, 368, 128, 0, 0, 0},
    {128e9, 64, 536, 284, 32, 0, 0, 0},
    {128e9, 256, 518, 263, 8, 0, 0, 0},
    {128e9, 1024, 513, 257, 2, 0, 0, 0},
    {1e12, 1, 16000, 16000, 16000, 0, 0, 0},
    {1e12, 4, 7000, 5500, 4000, 0, 0, 0},
    {1e12, 16, 4750, 2875, 1000, 0, 0, 0},
    {1e12, 64, 4187, 2218, 250, 0, 0, 0},
    {1e12, 256, 4046, 2054, 62.5, 0, 0, 1},
    {1e12, 1024, 4011, 2013, 15.6, 0, 0, 1},
};
// Section 5.4 / Table 2: with N = 64 on 32 GB V100s, ZeRO "can train models
// with up to 7.5B, 14B, and 128B parameters using P_os, P_os+g, and
// P_os+g+p"; Table 2 (MP = 1, 64 GPUs) prints the theoretical maxima 7.6B,
// 14.4B and 128B, and 2B for the baseline.
inline constexpr double kV100Bytes = 32e9;
struct Table2Row {
  int mp, gpus;
  double baseline, pos, pos_g, pos_g_p;  // largest model, parameters
};
inline constexpr Table2Row kTable2[] = {
    {1, 64, 2e9, 7.6e9, 14.4e9, 128e9},
    {2, 128, 4e9, 15.2e9, 28.8e9, 256e9},
    {4, 256, 8e9, 30.4e9, 57.6e9, 0.5e12},
    {8, 512, 16e9, 60.8e9, 115.2e9, 1e12},
    {16, 1024, 32e9, 121.6e9, 230.4e9, 2e12},
};

}  // namespace zero

// ---------------------------------------------------------------------------
// DeepSpeed's memory estimators, ported line for line from
// github.com/microsoft/DeepSpeed at 38327e07f6cd (2025-02-21):
//   deepspeed/runtime/zero/stage_1_and_2.py  estimate_zero2_model_states_mem_needs
//   deepspeed/runtime/zero/stage3.py         estimate_zero3_model_states_mem_needs
// Python's int() truncates toward zero; the estimates are non-negative, so
// a cast to int64 does the same. Both return {cpu bytes per node, gpu bytes
// per GPU}; the *_all_cold printers show them as bytes / 2**30 with "GB".
namespace deepspeed {

struct MemNeeds {
  std::int64_t cpu_bytes;  // per node (DeepSpeed's "per CPU")
  std::int64_t gpu_bytes;  // per GPU
  std::int64_t largest_layer_bytes = 0;  // stage 3 only: 4 * largest_layer_params
};

inline std::int64_t py_int(double v) { return std::int64_t(v); }

// stage_1_and_2.py, since PR #5099 (2024-06-04, "estimate_zero2_model_states_
// mem_needs: fixing memory estimation": 2-byte fp16/bf16 parameters, 18
// bytes of gradients, fp32 weights and Adam state partitioned).
inline MemNeeds estimate_zero2_model_states_mem_needs(double total_params, int num_gpus_per_node = 1,
                                                      int num_nodes = 1, bool cpu_offload = true,
                                                      double additional_buffer_factor = 1.5) {
  double total_gpus = double(num_nodes) * num_gpus_per_node;
  double gpu_mem, cpu_mem;
  if (cpu_offload) {
    gpu_mem = 2 * total_params;
    cpu_mem = total_params * std::max(4 * total_gpus, 16.0) * additional_buffer_factor;
  } else {
    gpu_mem = 2 * total_params + double(py_int(18 * total_params / total_gpus));
    cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor;
  }
  return {py_int(cpu_mem), py_int(gpu_mem)};
}

// The same function before PR #5099 (commit f4cb866c2's parent): without
// offload, 4 bytes of parameters plus 16 partitioned. DeepSpeed's docs page
// "Memory Requirements" (docs/code-docs/source/memory.rst, still at
// 38327e07f6cd) prints this version's output; kept so that page checks it.
inline MemNeeds estimate_zero2_model_states_mem_needs_before_5099(double total_params, int num_gpus_per_node = 1,
                                                                  int num_nodes = 1, bool cpu_offload = true,
                                                                  double additional_buffer_factor = 1.5) {
  double total_gpus = double(num_nodes) * num_gpus_per_node;
  double gpu_mem, cpu_mem;
  if (cpu_offload) {
    gpu_mem = 2 * total_params;
    cpu_mem = total_params * std::max(4 * total_gpus, 16.0) * additional_buffer_factor;
  } else {
    gpu_mem = 4 * total_params + double(py_int(16 * total_params / total_gpus));
    cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor;
  }
  return {py_int(cpu_mem), py_int(gpu_mem)};
}

// stage3.py. cpu_offload: the optimizer state on the CPU; cpu_offload_params:
// the parameters too; zero_init: the model built partitioned
// (deepspeed.zero.Init), so no node ever holds it whole.
inline MemNeeds estimate_zero3_model_states_mem_needs(double total_params, double largest_layer_params,
                                                      int num_gpus_per_node = 1, int num_nodes = 1,
                                                      bool cpu_offload = true, bool cpu_offload_params = true,
                                                      bool zero_init = true, double additional_buffer_factor = 1.5) {
  double total_gpus = double(num_nodes) * num_gpus_per_node;
  double gpus_factor = 1.0 / num_nodes;
  double largest_layer_memory = 4 * largest_layer_params;
  double gpu_mem, cpu_mem;
  if (cpu_offload) {
    if (cpu_offload_params) {
      gpu_mem = largest_layer_memory;
      if (zero_init)
        cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor;
      else
        cpu_mem = total_params * std::max(4.0 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor;
    } else {
      gpu_mem = largest_layer_memory + double(py_int(2 * total_params / total_gpus));
      if (zero_init)
        cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor;
      else
        cpu_mem = total_params * std::max(4.0 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor;
    }
  } else {
    gpu_mem = largest_layer_memory + double(py_int(18 * total_params / total_gpus));
    if (zero_init)
      cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor;
    else
      cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor;
  }
  return {py_int(cpu_mem), py_int(gpu_mem), py_int(largest_layer_memory)};
}

}  // namespace deepspeed

// ---------------------------------------------------------------------------
// ZeRO-Infinity: Rajbhandari, Ruwase, Rasley, Smith, He. "ZeRO-Infinity:
// Breaking the GPU Memory Wall for Extreme Scale Deep Learning", SC'21,
// arXiv 2104.07857. Its machine is the NVIDIA DGX-2 (plan::Cluster::preset
// ("dgx2")): 16 V100 32 GB, 1.5 TB of CPU DRAM and 30 TB of NVMe per node
// (the DRAM and NVMe figures as DeepSpeed's ZeRO-Inference post states them,
// docs/_posts/2022-09-10-zero-inference.md).
namespace zero_infinity {

// Abstract (confirmed: arXiv abstract page): "It can be used to fine-tune
// trillion parameter models on a single NVIDIA DGX-2 node".
inline constexpr double kOneNodeParams = 1e12;
inline constexpr int kOneNodeGpus = 16;
// Abstract (confirmed): "it sustains over 25 petaflops on 512 NVIDIA V100
// GPUs (40% of peak)". 25e15 / 512 = 48.8 Tflop/s per GPU, 39% of the V100's
// 125 Tflop/s; DeepSpeed's ZeRO-3 Offload post (docs/_posts/2021-03-08-
// zero3-offload.md, confirmed) gives the run as "1 Trillion parameters ...
// 25 PetaFlops ... on 512 NVIDIA V100 GPUs, achieving 49 TFlops/GPU".
inline constexpr double kSustainedFlops = 25e15;
inline constexpr int kSustainedGpus = 512;
inline constexpr double kFractionOfPeak = 0.40;
inline constexpr double kPerGpuFlops = 49e12;  // the ZeRO-3 Offload post's figure
// Abstract (confirmed): "It requires 800 NVIDIA V100 GPUs just to fit a
// trillion parameter model for training" (the 16 bytes per parameter of
// ZeRO's baseline over 32 GB: 1e12 * 16 / 32e9 = 500 GPUs for model states
// alone; the 800 includes more than model states, unconfirmed what).
inline constexpr int kGpusToFit1T = 800;
// Largest models (the authors' SC21 slides, DeepSpeed's docs/assets/files/
// SC21-ZeRO-Infinity.pdf, confirmed: "32T params on 32 nodes", "1T params
// on a single node"; the paper says "tens and even hundreds of trillions").
inline constexpr double kLargestParams32Nodes = 32e12;
inline constexpr int kLargest32Nodes = 32;
inline constexpr double kLargestParams1Node = 1e12;
// Section 1 / Figure 1 comparisons, unconfirmed (read in a summary of the
// paper, not in its text): 32T on 512 GPUs is "50x larger than 3D
// parallelism" on the same hardware, i.e. 3D parallelism fits about 0.65T.
inline constexpr double kVs3dParallelismRatio = 50;  // unconfirmed
// DeepSpeed's ZeRO-3 Offload post (confirmed): with ZeRO-3 Offload (CPU, no
// NVMe) "a trillion and two trillion parameter models on NVIDIA 32GB V100
// DGX-2 cluster with 256 GPUs and 512 GPUs, respectively. In contrast, the
// state-of-art 3D Parallelism requires 800 GPUs, and 1600 GPUs"; and "over
// 40B parameters efficiently on a single GPU (e.g., 32GB V100 GPU + 1.5TB
// CPU memory)".
inline constexpr double kZero3OffloadParams256Gpus = 1e12;
inline constexpr double kZero3OffloadParams512Gpus = 2e12;
inline constexpr int k3dParallelismGpusFor1T = 800;
inline constexpr int k3dParallelismGpusFor2T = 1600;
inline constexpr double kZero3OffloadParams1Gpu = 40e9;

// The paper's Table 1 (the model configurations of its throughput figures:
// nodes, parameters, hidden size, layers, batch per GPU, model-parallel
// degree, where fp16 parameters and optimizer states live) and its NVMe and
// PCIe bandwidths on the DGX-2: unconfirmed. I could not read the paper's
// text in any stored copy, so none is given here rather than a recollection;
// add them with their table reference once read.

}  // namespace zero_infinity

}  // namespace frugal::published
