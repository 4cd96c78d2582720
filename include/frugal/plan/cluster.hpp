#pragma once
// A cluster the planner can price without having it: how many nodes, how
// many GPUs each, and what every memory and link does per second. The plan
// simulator (issue 20) runs a plan on one of these in virtual time; the cost
// model sees one GPU of it through device_profile().
//
// Units are plain: bytes, bytes per second, flop per second, seconds, all
// doubles; no "GB" strings, so a file means one thing. Bandwidths are per
// direction. A cluster is one flat JSON object, every field required (an
// unknown field is an error too, so a misspelt one is not silently left at a
// default). The dgx2 preset, as Cluster::preset("dgx2").to_json() writes it:
//
//   {
//     "version": 1,
//     "name": "dgx2",
//     "gpu": "V100-SXM3-32GB",
//     "nodes": 1,                          whole, >= 1
//     "gpus_per_node": 16,                 whole, >= 1
//     "hbm_bytes": 3.2e+10,                per GPU, > 0
//     "hbm_bytes_per_s": 9e+11,            per GPU, > 0
//     "f32_flops": 1.57e+13,               per GPU, dense peaks, > 0
//     "tf32_flops": 1.57e+13,              (a GPU without TF32 gives its f32 rate)
//     "bf16_flops": 1.57e+13,              (a GPU without bf16 tensor cores: its f32 rate)
//     "f16_flops": 1.25e+14,
//     "op_latency_s": 5e-06,               kernel launch, >= 0
//     "pcie_bytes_per_s": 1.575e+10,       each GPU's host link, > 0
//     "pcie_latency_s": 1e-05,             >= 0
//     "nvlink_bytes_per_s": 1.5e+11,       per GPU, within a node, > 0
//     "nvlink_latency_s": 2e-06,           >= 0
//     "internode_bytes_per_s": 1e+11,      per node (all its NICs); > 0 when nodes > 1, else >= 0
//     "internode_latency_s": 5e-06,        >= 0
//     "host_bytes": 1.5e+12,               per node, > 0
//     "cpu_cores": 48,                     per node, whole, >= 1
//     "host_memory_bytes_per_s": 2.56e+11, per node, the DRAM channels' peak, > 0
//     "nvme_bytes": 3.072e+13,             per node, >= 0 (0: no NVMe)
//     "nvme_read_bytes_per_s": 2.4e+10,    per node, all drives; > 0 when nvme_bytes > 0, else >= 0
//     "nvme_write_bytes_per_s": 1.6e+10,   likewise
//     "nvme_latency_s": 1e-04              >= 0
//   }
//
// (The comments above are not JSON; tools/frugal-plan/clusters/*.json hold
// the presets as to_json writes them, and a test keeps them equal.)
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/json.hpp"
#include "device_profile.hpp"

namespace frugal::plan {

struct Cluster {
  // Bumped when a field changes meaning, so an old file is refused.
  static constexpr int kVersion = 1;

  std::string name;
  std::string gpu;  // the GPU model, for reports
  int nodes = 1;
  int gpus_per_node = 1;

  // One GPU.
  double hbm_bytes = 0;
  double hbm_bytes_per_s = 0;
  double f32_flops = 0;   // plain f32 (CUDA cores)
  double tf32_flops = 0;  // f32 GEMMs on TF32 tensor cores, dense
  double bf16_flops = 0;  // tensor cores, dense (no 2:4 sparsity)
  double f16_flops = 0;
  double op_latency_s = 0;

  // Links, per direction.
  double pcie_bytes_per_s = 0;  // one GPU to its host
  double pcie_latency_s = 0;
  double nvlink_bytes_per_s = 0;  // one GPU to the others of its node (NVLink/NVSwitch)
  double nvlink_latency_s = 0;
  double internode_bytes_per_s = 0;  // one node to the others: the sum of its NICs
  double internode_latency_s = 0;

  // One node.
  double host_bytes = 0;
  int cpu_cores = 1;
  // What the node's DRAM channels move per second (an optimizer update
  // offloaded to the host streams its operands through them).
  double host_memory_bytes_per_s = 0;
  double nvme_bytes = 0;
  double nvme_read_bytes_per_s = 0;  // all the node's drives together
  double nvme_write_bytes_per_s = 0;
  double nvme_latency_s = 0;

  bool operator==(const Cluster&) const = default;

  int total_gpus() const { return nodes * gpus_per_node; }
  bool has_nvme() const { return nvme_bytes > 0; }

  // Peak flop/s of one GPU for compute in `dtype`; tf32 asks for f32 GEMMs
  // on TF32 tensor cores.
  double flops(DType dtype, bool tf32 = false) const {
    switch (dtype) {
      case DType::f32: return tf32 ? tf32_flops : f32_flops;
      case DType::bf16: return bf16_flops;
      case DType::f16: return f16_flops;
      default: break;
    }
    fail("Cluster '", name, "': no flop/s for ", dtype_name(dtype),
         " compute; a cluster gives f32, tf32, bf16 and f16 rates");
  }

  // exp, log, tanh... per second: the special-function units, 16 per SM
  // beside 64 FP32 lanes on V100 and A100 (128 on H100, so there this is
  // twice the truth), each lane's FMA counted as 2 flops in f32_flops.
  double transcendentals_per_s() const { return f32_flops / 8; }

  // What the planner's cost model needs of one GPU of this cluster. The
  // NVMe numbers are the node's shared by all its GPUs (each GPU streams
  // its own shard at once, as ZeRO-Infinity does); the CPU threads are the
  // node's cores shared the same way (the host optimizer of each rank).
  // `ranks_on_node`: the job's GPUs on a node, which share its DRAM for
  // updates offloaded there (0: all of them).
  DeviceProfile device_profile(DType compute, bool tf32 = false, int ranks_on_node = 0) const {
    DeviceProfile p = DeviceProfile::defaults("cuda", std::max(1, cpu_cores / gpus_per_node));
    p.machine = "cluster " + name + " (" + gpu + ")";
    p.gemm_flops = flops(compute, tf32);
    p.stream_bytes = hbm_bytes_per_s;
    p.transcendentals_per_s = transcendentals_per_s();
    p.tile_flops = f32_flops;  // frugal's CUDA attention runs on the FP32 lanes, not the tensor cores
    p.op_latency_s = op_latency_s;
    p.copy_bytes = pcie_bytes_per_s;
    p.copy_latency_s = pcie_latency_s;
    p.nvme_read_bytes = nvme_read_bytes_per_s / gpus_per_node;
    p.nvme_write_bytes = nvme_write_bytes_per_s / gpus_per_node;
    p.nvme_latency_s = nvme_latency_s;
    p.nvme_dir = "";
    p.host_update_bytes = host_memory_bytes_per_s / (ranks_on_node > 0 ? std::min(ranks_on_node, gpus_per_node) : gpus_per_node);
    return p;
  }

  // ---- Collectives: the alpha-beta model of a ring -----------------------
  //
  // `bytes` is always the whole buffer (what all-reduce reduces, what
  // reduce-scatter scatters, what all-gather gathers), so
  // all_reduce == reduce_scatter + all_gather for the same bytes. With p
  // ranks on a ring, each of its 2(p-1) (all-reduce) or p-1 (the others)
  // steps sends bytes/p to the next rank (Patarasuk & Yuan 2009; Thakur,
  // Rabenseifner & Gropp 2005; NCCL's tuning model, src/graph/tuning.cc,
  // counts nsteps = 2(nRanks-1) for ring all-reduce, nRanks-1 for the
  // others):
  //   all-reduce      2(p-1) a + 2(p-1)/p * bytes / B
  //   reduce-scatter   (p-1) a +  (p-1)/p * bytes / B
  //   all-gather       (p-1) a +  (p-1)/p * bytes / B
  //   broadcast        (p-1) a +            bytes / B   (pipelined chain)
  // B is the bandwidth of the ring's slowest hop per rank, a the latency of
  // one step.
  //
  // Ranks fill nodes in order. Within one node B is the NVLink bandwidth.
  // Across nodes, NCCL runs one ring per NIC (its channels), each carrying
  // 1/(rings) of the buffer, so what leaves a node per step is the same as
  // what leaves one GPU, and the node's NICs together carry it: B is
  // min(NVLink, the NIC bandwidth the node's participating GPUs reach).
  // A GPU reaches the NICs next to it (NCCL's GPU-NIC affinity), so a node
  // with g of its G GPUs in the job reaches g/G of internode_bytes_per_s;
  // the least-filled node (the last, when ranks do not fill it) sets B.
  // (Hierarchical all-reduce, an intra-node reduce-scatter, G parallel
  // inter-node rings on 1/G of the buffer, an intra-node all-gather, moves
  // the same bytes per NIC and has the same bandwidth term.) Every step of a
  // multi-node ring waits for its slowest hop, so a = the inter-node latency.
  double all_reduce_seconds(double bytes, int ranks) const {
    Ring r = ring("all_reduce_seconds", bytes, ranks);
    double p = ranks;
    return r.steps(2 * (p - 1)) + 2 * (p - 1) / p * bytes / r.bytes_per_s;
  }
  double reduce_scatter_seconds(double bytes, int ranks) const {
    Ring r = ring("reduce_scatter_seconds", bytes, ranks);
    double p = ranks;
    return r.steps(p - 1) + (p - 1) / p * bytes / r.bytes_per_s;
  }
  double all_gather_seconds(double bytes, int ranks) const {
    Ring r = ring("all_gather_seconds", bytes, ranks);
    double p = ranks;
    return r.steps(p - 1) + (p - 1) / p * bytes / r.bytes_per_s;
  }
  double broadcast_seconds(double bytes, int ranks) const {
    Ring r = ring("broadcast_seconds", bytes, ranks);
    if (ranks == 1) return 0;
    return r.steps(ranks - 1) + bytes / r.bytes_per_s;
  }

  // ---- Host and NVMe transfers -------------------------------------------
  //
  // One GPU's copy over its own PCIe link. Contention is not modelled: on
  // DGX machines two GPUs (and NICs, and drives) sit behind one PCIe switch
  // whose uplink to the CPU is itself one x16 link, so when every GPU copies
  // to the host at once each gets less than pcie_bytes_per_s. A plan that
  // streams from the host on all GPUs at once is priced optimistically here.
  double h2d_seconds(double bytes) const {
    check_bytes("h2d_seconds", bytes);
    return pcie_latency_s + bytes / pcie_bytes_per_s;
  }
  double d2h_seconds(double bytes) const {
    check_bytes("d2h_seconds", bytes);
    return pcie_latency_s + bytes / pcie_bytes_per_s;
  }
  // A read or write of `bytes` by one GPU's rank while `concurrent_gpus` of
  // the node's GPUs do the same: the node's drives are shared evenly. The
  // host-to-GPU leg is h2d_seconds, separate (they pipeline).
  double nvme_read_seconds(double bytes, int concurrent_gpus = 1) const {
    check_nvme("nvme_read_seconds", bytes, concurrent_gpus);
    return nvme_latency_s + bytes / (nvme_read_bytes_per_s / concurrent_gpus);
  }
  double nvme_write_seconds(double bytes, int concurrent_gpus = 1) const {
    check_nvme("nvme_write_seconds", bytes, concurrent_gpus);
    return nvme_latency_s + bytes / (nvme_write_bytes_per_s / concurrent_gpus);
  }

  // ---- Files and presets -------------------------------------------------
  std::string to_json() const;
  static Cluster from_json(std::string_view text, const std::string& source_name);
  // dgx2, dgx-a100, dgx-h100, dgx-h200: one node each; set `nodes` for more.
  static Cluster preset(std::string_view name);
  static constexpr const char* kPresetNames = "dgx2, dgx-a100, dgx-h100, dgx-h200";

 private:
  struct Ring {
    double latency_s;
    double bytes_per_s;
    double steps(double n) const { return n * latency_s; }
  };
  Ring ring(const char* what, double bytes, int ranks) const {
    check_bytes(what, bytes);
    if (ranks < 1 || ranks > total_gpus())
      fail("Cluster::", what, ": ", ranks, " ranks on '", name, "', which has ", total_gpus(), " GPUs (", nodes,
           " nodes of ", gpus_per_node, "): give 1 to ", total_gpus(), " ranks");
    if (ranks <= gpus_per_node) return {nvlink_latency_s, nvlink_bytes_per_s};
    if (!(internode_bytes_per_s > 0))
      fail("Cluster::", what, ": ", ranks, " ranks span nodes of '", name,
           "', whose internode_bytes_per_s is 0: give the nodes' NIC bandwidth");
    int last = ranks % gpus_per_node;
    int least_filled = last == 0 ? gpus_per_node : last;
    double nics = internode_bytes_per_s * least_filled / gpus_per_node;
    return {std::max(nvlink_latency_s, internode_latency_s), std::min(nvlink_bytes_per_s, nics)};
  }
  void check_bytes(const char* what, double bytes) const {
    if (!(bytes >= 0) || !std::isfinite(bytes))
      fail("Cluster::", what, ": ", bytes, " bytes on '", name, "': give a finite byte count >= 0");
  }
  void check_nvme(const char* what, double bytes, int concurrent_gpus) const {
    check_bytes(what, bytes);
    if (!has_nvme())
      fail("Cluster::", what, ": cluster '", name, "' has no NVMe (nvme_bytes is 0)");
    if (concurrent_gpus < 1 || concurrent_gpus > gpus_per_node)
      fail("Cluster::", what, ": ", concurrent_gpus, " GPUs sharing one node's NVMe on '", name,
           "', whose nodes have ", gpus_per_node, " GPUs: give 1 to ", gpus_per_node);
  }
};

namespace detail {

// The fields in file order: to_json writes them so, from_json requires
// exactly these.
inline constexpr const char* kClusterFields[] = {
    "version",           "name",           "gpu",
    "nodes",             "gpus_per_node",  "hbm_bytes",
    "hbm_bytes_per_s",   "f32_flops",      "tf32_flops",
    "bf16_flops",        "f16_flops",      "op_latency_s",
    "pcie_bytes_per_s",  "pcie_latency_s", "nvlink_bytes_per_s",
    "nvlink_latency_s",  "internode_bytes_per_s", "internode_latency_s",
    "host_bytes",        "cpu_cores",      "host_memory_bytes_per_s", "nvme_bytes",
    "nvme_read_bytes_per_s", "nvme_write_bytes_per_s", "nvme_latency_s"};

}  // namespace detail

inline std::string Cluster::to_json() const {
  std::string o = "{\n";
  auto key = [&](const char* k) {
    if (o.size() > 2) o += ",\n";
    o += "  \"";
    o += k;
    o += "\": ";
  };
  auto str = [&](const char* k, const std::string& v) {
    key(k);
    o += json_quote(v);
  };
  auto num = [&](const char* k, double v) {
    key(k);
    o += frugal::detail::json_number(v);
  };
  num("version", kVersion);
  str("name", name);
  str("gpu", gpu);
  num("nodes", nodes);
  num("gpus_per_node", gpus_per_node);
  num("hbm_bytes", hbm_bytes);
  num("hbm_bytes_per_s", hbm_bytes_per_s);
  num("f32_flops", f32_flops);
  num("tf32_flops", tf32_flops);
  num("bf16_flops", bf16_flops);
  num("f16_flops", f16_flops);
  num("op_latency_s", op_latency_s);
  num("pcie_bytes_per_s", pcie_bytes_per_s);
  num("pcie_latency_s", pcie_latency_s);
  num("nvlink_bytes_per_s", nvlink_bytes_per_s);
  num("nvlink_latency_s", nvlink_latency_s);
  num("internode_bytes_per_s", internode_bytes_per_s);
  num("internode_latency_s", internode_latency_s);
  num("host_bytes", host_bytes);
  num("cpu_cores", cpu_cores);
  num("host_memory_bytes_per_s", host_memory_bytes_per_s);
  num("nvme_bytes", nvme_bytes);
  num("nvme_read_bytes_per_s", nvme_read_bytes_per_s);
  num("nvme_write_bytes_per_s", nvme_write_bytes_per_s);
  num("nvme_latency_s", nvme_latency_s);
  o += "\n}\n";
  return o;
}

inline Cluster Cluster::from_json(std::string_view text, const std::string& source_name) {
  Json root = parse_json_object(text, source_name + ": not a cluster description: its text");
  for (auto& [k, v] : root.members) {
    bool known = std::find_if(std::begin(detail::kClusterFields), std::end(detail::kClusterFields),
                              [&](const char* f) { return k == f; }) != std::end(detail::kClusterFields);
    if (!known)
      fail<DataError>(source_name, ": field '", k, "' is not a cluster field (the fields: version, name, gpu, ",
                      "nodes, gpus_per_node, hbm_bytes, ... as Cluster::preset(\"dgx2\").to_json() writes them)");
  }
  const frugal::detail::ProfileFields j(text, source_name);
  auto at_least = [&](const char* k, double lo, bool strictly) {
    double v = j.number(k);
    if (strictly ? !(v > lo) : !(v >= lo))
      fail<DataError>(source_name, ": field '", k, "' is ", v, ", must be ", strictly ? "above " : "at least ", lo);
    return v;
  };
  auto whole = [&](const char* k) {
    double v = at_least(k, 1, false);
    if (v != std::floor(v) || v > 1e7)
      fail<DataError>(source_name, ": field '", k, "' is ", v, ", not a whole number");
    return int(v);
  };
  double version = j.number("version");
  if (version != kVersion)
    fail<DataError>(source_name, ": field 'version' is ", version, ", this build reads version ", kVersion);
  Cluster c;
  c.name = j.string("name");
  if (c.name.empty()) fail<DataError>(source_name, ": field 'name' is empty");
  c.gpu = j.string("gpu");
  c.nodes = whole("nodes");
  c.gpus_per_node = whole("gpus_per_node");
  c.hbm_bytes = at_least("hbm_bytes", 0, true);
  c.hbm_bytes_per_s = at_least("hbm_bytes_per_s", 0, true);
  c.f32_flops = at_least("f32_flops", 0, true);
  c.tf32_flops = at_least("tf32_flops", 0, true);
  c.bf16_flops = at_least("bf16_flops", 0, true);
  c.f16_flops = at_least("f16_flops", 0, true);
  c.op_latency_s = at_least("op_latency_s", 0, false);
  c.pcie_bytes_per_s = at_least("pcie_bytes_per_s", 0, true);
  c.pcie_latency_s = at_least("pcie_latency_s", 0, false);
  c.nvlink_bytes_per_s = at_least("nvlink_bytes_per_s", 0, true);
  c.nvlink_latency_s = at_least("nvlink_latency_s", 0, false);
  c.internode_bytes_per_s = at_least("internode_bytes_per_s", 0, c.nodes > 1);
  c.internode_latency_s = at_least("internode_latency_s", 0, false);
  c.host_bytes = at_least("host_bytes", 0, true);
  c.cpu_cores = whole("cpu_cores");
  c.host_memory_bytes_per_s = at_least("host_memory_bytes_per_s", 0, true);
  c.nvme_bytes = at_least("nvme_bytes", 0, false);
  c.nvme_read_bytes_per_s = at_least("nvme_read_bytes_per_s", 0, c.nvme_bytes > 0);
  c.nvme_write_bytes_per_s = at_least("nvme_write_bytes_per_s", 0, c.nvme_bytes > 0);
  c.nvme_latency_s = at_least("nvme_latency_s", 0, false);
  return c;
}

// Vendor datasheet figures; GB and TB as the datasheets write them (1e9,
// 1e12 bytes: a GPU's "80 GB" holds a little more, 80 GiB, of which the
// driver keeps some, so the decimal figure is the safe budget). Gb/s of a
// NIC / 8 = bytes/s. NVLink figures are the datasheets' bidirectional ones
// halved. Latencies are not datasheet figures but round orders of
// magnitude: a kernel launch 5 us, a cudaMemcpy 10 us, an NVLink ring step
// 2 us, an InfiniBand ring step 5 us, an NVMe read 100 us. NVMe bandwidths
// are not on the datasheets either: they are the drives' sequential rates
// times the drive count, marked "estimate" below; replace them with
// measurements (fio, or frugal-info --calibrate on the machine) when known.
inline Cluster Cluster::preset(std::string_view which) {
  Cluster c;
  c.nodes = 1;
  c.op_latency_s = 5e-6;
  c.pcie_latency_s = 10e-6;
  c.nvlink_latency_s = 2e-6;
  c.internode_latency_s = 5e-6;
  c.nvme_latency_s = 100e-6;
  if (which == "dgx2") {
    // NVIDIA DGX-2 (2018): the ZeRO-Infinity paper's machine.
    c.name = "dgx2";
    c.gpu = "V100-SXM3-32GB";
    c.gpus_per_node = 16;                // DGX-2 datasheet: 16x Tesla V100 32GB
    c.hbm_bytes = 32e9;                  // V100 datasheet: 32 GB HBM2
    c.hbm_bytes_per_s = 900e9;           // V100 SXM datasheet: 900 GB/s
    c.f32_flops = 15.7e12;               // V100 SXM2 datasheet: 15.7 TFLOPS single precision
    c.tf32_flops = c.f32_flops;          // Volta has no TF32
    c.bf16_flops = c.f32_flops;          // nor bf16 tensor cores: bf16 math runs on the f32 units (about)
    c.f16_flops = 125e12;                // V100 SXM2 datasheet: 125 TFLOPS tensor performance
    c.pcie_bytes_per_s = 15.75e9;        // PCIe Gen3 x16: 8 GT/s * 16 lanes * 128/130 / 8
    c.nvlink_bytes_per_s = 150e9;        // NVSwitch: 300 GB/s per GPU bidirectional (DGX-2 announcement)
    c.internode_bytes_per_s = 100e9;     // 8x 100 Gb/s EDR InfiniBand ("1600 Gb/s bidirectional")
    c.host_bytes = 1.5e12;               // 1.5 TB system memory (DGX-2 datasheet; DeepSpeed ZeRO-Inference post)
    c.cpu_cores = 48;                    // 2x Xeon Platinum 8168, 24 cores each (DGX-2 datasheet)
    c.host_memory_bytes_per_s = 2.56e11;  // 2 sockets x 6 channels of DDR4-2666 (21.3 GB/s each; Intel ARK)
    c.nvme_bytes = 8 * 3.84e12;          // "30 TB (8x 3.84 TB) NVMe" (DGX-2 datasheet)
    c.nvme_read_bytes_per_s = 8 * 3e9;   // estimate: 8 PCIe Gen3 drives at ~3 GB/s sequential read
    c.nvme_write_bytes_per_s = 8 * 2e9;  // estimate: ~2 GB/s sequential write each
    return c;
  }
  if (which == "dgx-a100") {
    c.name = "dgx-a100";
    c.gpu = "A100-SXM4-80GB";
    c.gpus_per_node = 8;                 // DGX A100 640GB datasheet: 8x A100 80GB
    c.hbm_bytes = 80e9;                  // A100 datasheet: 80 GB HBM2e
    c.hbm_bytes_per_s = 2039e9;          // A100 80GB SXM datasheet: 2,039 GB/s
    c.f32_flops = 19.5e12;               // A100 datasheet: FP32 19.5 TFLOPS
    c.tf32_flops = 156e12;               // TF32 tensor core 156 TFLOPS (312 with sparsity)
    c.bf16_flops = 312e12;               // BF16 tensor core 312 TFLOPS dense
    c.f16_flops = 312e12;                // FP16 tensor core 312 TFLOPS dense
    c.pcie_bytes_per_s = 31.5e9;         // PCIe Gen4 x16: 16 GT/s * 16 * 128/130 / 8
    c.nvlink_bytes_per_s = 300e9;        // NVLink 3: 600 GB/s per GPU bidirectional
    c.internode_bytes_per_s = 200e9;     // 8x 200 Gb/s HDR InfiniBand (ConnectX-6)
    c.host_bytes = 2e12;                 // 2 TB system memory
    c.cpu_cores = 128;                   // 2x AMD EPYC 7742, 64 cores each
    c.host_memory_bytes_per_s = 4.096e11;  // 2 sockets x 8 channels of DDR4-3200 (25.6 GB/s each; AMD's spec)
    c.nvme_bytes = 8 * 3.84e12;          // 30 TB (8x 3.84 TB) U.2 NVMe
    c.nvme_read_bytes_per_s = 8 * 6e9;   // estimate: 8 PCIe Gen4 drives at ~6 GB/s sequential read
    c.nvme_write_bytes_per_s = 8 * 3e9;  // estimate: ~3 GB/s sequential write each
    return c;
  }
  if (which == "dgx-h100" || which == "dgx-h200") {
    bool h200 = which == "dgx-h200";
    c.name = std::string(which);
    c.gpu = h200 ? "H200-SXM-141GB" : "H100-SXM5-80GB";
    c.gpus_per_node = 8;                                // DGX H100 / H200 datasheets: 8 GPUs
    c.hbm_bytes = h200 ? 141e9 : 80e9;                  // H100: 80 GB HBM3; H200: 141 GB HBM3e
    c.hbm_bytes_per_s = h200 ? 4.8e12 : 3.35e12;        // H100 SXM: 3.35 TB/s; H200: 4.8 TB/s
    c.f32_flops = 67e12;                                // H100 SXM datasheet: FP32 67 TFLOPS (H200 the same die)
    c.tf32_flops = 494.5e12;                            // TF32 tensor core 989 TFLOPS with sparsity, half dense
    c.bf16_flops = 989.5e12;                            // BF16 1,979 TFLOPS with sparsity, half dense
    c.f16_flops = 989.5e12;                             // FP16 likewise
    c.pcie_bytes_per_s = 63e9;                          // PCIe Gen5 x16: 32 GT/s * 16 * 128/130 / 8
    c.nvlink_bytes_per_s = 450e9;                       // NVLink 4: 900 GB/s per GPU bidirectional
    c.internode_bytes_per_s = 400e9;                    // 8x 400 Gb/s NDR InfiniBand (ConnectX-7)
    c.host_bytes = 2e12;                                // 2 TB system memory
    c.cpu_cores = 112;                                  // 2x Xeon Platinum 8480C, 56 cores each
    c.host_memory_bytes_per_s = 6.144e11;               // 2 sockets x 8 channels of DDR5-4800 (38.4 GB/s each)
    c.nvme_bytes = 8 * 3.84e12;                         // 30 TB (8x 3.84 TB) U.2 NVMe
    c.nvme_read_bytes_per_s = 8 * 6e9;                  // estimate, as dgx-a100
    c.nvme_write_bytes_per_s = 8 * 3e9;                 // estimate
    return c;
  }
  fail("Cluster::preset: no preset named '", which, "'; the presets are ", kPresetNames,
       " (or describe the machine in a JSON file: Cluster::from_json)");
}

}  // namespace frugal::plan
