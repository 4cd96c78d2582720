// Issue 20: the cluster description (plan/cluster.hpp), its presets and
// collective costs, and the independent references of the published checks
// (bench/published/zero_formulas.hpp) against the figures their sources print.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <frugal/plan/cluster.hpp>

#include "../bench/published/zero_formulas.hpp"

using frugal::DataError;
using frugal::DType;
using frugal::plan::Cluster;
namespace cluster_refs = frugal::published;

namespace {

const std::vector<std::string> cluster_preset_names = {"dgx2", "dgx-a100", "dgx-h100", "dgx-h200"};

// The preset's JSON with one field's value replaced (or, with an empty
// value, the field's line removed).
std::string cluster_json_with(const std::string& field, const std::string& value) {
  std::istringstream in(Cluster::preset("dgx2").to_json());
  std::string line, out;
  bool found = false;
  while (std::getline(in, line)) {
    if (line.find("\"" + field + "\":") != std::string::npos) {
      found = true;
      if (value.empty()) continue;
      bool comma = line.back() == ',';
      line = "  \"" + field + "\": " + value + (comma ? "," : "");
    }
    out += line + "\n";
  }
  if (!found) FAIL("no field " << field << " in the dgx2 preset");
  // A removed last field leaves a trailing comma: drop it.
  auto brace = out.rfind('}');
  auto comma = out.find_last_not_of(" \n", brace - 1);
  if (out[comma] == ',') out.erase(comma, 1);
  return out;
}

// The error Cluster::from_json gives for `text`, or "" when it parses.
std::string cluster_error(const std::string& text) {
  try {
    Cluster::from_json(text, "bad.json");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// DeepSpeed's printers show bytes / 2**30 with "{:.2f}"; printf rounds the
// same binary value the same way.
std::string cluster_gib2(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", double(bytes) / double(1ll << 30));
  return buf;
}

// Table 1's figure `printed`, with `decimals` decimals, is `exact` rounded
// or cut to that many.
bool cluster_matches_printed(double exact, double printed, int decimals) {
  double scale = std::pow(10.0, decimals);
  double rounded = std::round(exact * scale) / scale, cut = std::floor(exact * scale) / scale;
  double eps = 1e-9 * std::max(1.0, printed);
  return std::abs(rounded - printed) < eps || std::abs(cut - printed) < eps;
}

}  // namespace

TEST_CASE("every cluster preset round-trips through JSON exactly, and its file is what to_json writes", "[cluster]") {
  auto dir = std::filesystem::path(__FILE__).parent_path() / ".." / "tools" / "frugal-plan" / "clusters";
  for (const auto& name : cluster_preset_names) {
    INFO(name);
    Cluster c = Cluster::preset(name);
    std::string text = c.to_json();
    Cluster back = Cluster::from_json(text, name + ".json");
    CHECK(back == c);
    CHECK(back.to_json() == text);
    std::ifstream f(dir / (name + ".json"));
    REQUIRE(f);
    std::stringstream file;
    file << f.rdbuf();
    CHECK(file.str() == text);  // regenerate the file from to_json when a preset changes
    // Several nodes round-trip too.
    c.nodes = 32;
    CHECK(Cluster::from_json(c.to_json(), name) == c);
  }
}

TEST_CASE("an unknown preset names the presets", "[cluster]") {
  CHECK_THROWS_WITH(Cluster::preset("dgx-1"), Catch::Contains("'dgx-1'") && Catch::Contains("dgx2, dgx-a100, dgx-h100, dgx-h200"));
}

TEST_CASE("a malformed cluster file names the file, the field and what is wrong", "[cluster]") {
  REQUIRE(cluster_error(cluster_json_with("nodes", "1")).empty());
  struct Case {
    std::string field, value, says;
  };
  for (const Case& k : std::vector<Case>{
           {"hbm_bytes", "", "field 'hbm_bytes' is missing"},
           {"nvme_latency_s", "", "field 'nvme_latency_s' is missing"},
           {"hbm_bytes", "\"32GB\"", "field 'hbm_bytes' should be a number, found the string \"32GB\""},
           {"name", "3", "field 'name' should be a string"},
           {"hbm_bytes", "0", "field 'hbm_bytes' is 0, must be above 0"},
           {"f16_flops", "-1.25e14", "field 'f16_flops' is -1.25e+14, must be above 0"},
           {"nvlink_latency_s", "-1e-6", "field 'nvlink_latency_s' is -1e-06, must be at least 0"},
           {"nodes", "1.5", "field 'nodes' is 1.5, not a whole number"},
           {"gpus_per_node", "0", "field 'gpus_per_node' is 0, must be at least 1"},
           {"cpu_cores", "[48]", "field 'cpu_cores' should be a number, found an array"},
           {"version", "2", "field 'version' is 2"},
       }) {
    INFO(k.field << " = " << k.value);
    std::string e = cluster_error(cluster_json_with(k.field, k.value));
    CHECK_THAT(e, Catch::StartsWith("bad.json: ") && Catch::Contains(k.says));
  }
  // A misspelt field is named, not left at a default.
  std::string typo = cluster_json_with("nodes", "1, \"nvlink_byte_per_s\": 1");
  CHECK_THAT(cluster_error(typo), Catch::Contains("field 'nvlink_byte_per_s' is not a cluster field"));
  // Several nodes need a network; one node may have none. NVMe bandwidth is
  // needed only with NVMe.
  std::string no_net = cluster_json_with("internode_bytes_per_s", "0");
  CHECK(cluster_error(no_net).empty());
  Cluster c = Cluster::from_json(no_net, "x");
  c.nodes = 2;
  CHECK_THAT(cluster_error(c.to_json()), Catch::Contains("field 'internode_bytes_per_s' is 0, must be above 0"));
  c = Cluster::preset("dgx2");
  c.nvme_read_bytes_per_s = 0;
  CHECK_THAT(cluster_error(c.to_json()), Catch::Contains("field 'nvme_read_bytes_per_s' is 0, must be above 0"));
  c.nvme_bytes = 0;
  CHECK(cluster_error(c.to_json()).empty());
  CHECK_THROWS_WITH(c.nvme_read_seconds(1e9), Catch::Contains("has no NVMe"));
  CHECK_THAT(cluster_error("{\"version\": 1"), Catch::StartsWith("bad.json: not a cluster description"));
}

TEST_CASE("collective costs match hand-computed ring figures", "[cluster]") {
  // One DGX-2: 16 GPUs on NVSwitch, 150e9 B/s a direction, 2 us a step.
  Cluster dgx2 = Cluster::preset("dgx2");
  CHECK(dgx2.all_reduce_seconds(1e9, 16) == Approx(2 * 15 * 2e-6 + 2.0 * 15 / 16 * 1e9 / 150e9));  // 0.01256 s
  CHECK(dgx2.all_reduce_seconds(1e9, 16) == Approx(0.01256));
  CHECK(dgx2.reduce_scatter_seconds(1e9, 4) == Approx(3 * 2e-6 + 0.75 * 1e9 / 150e9));
  CHECK(dgx2.broadcast_seconds(1e9, 16) == Approx(15 * 2e-6 + 1e9 / 150e9));
  CHECK(dgx2.all_reduce_seconds(1e9, 1) == 0);
  CHECK(dgx2.all_gather_seconds(1e9, 1) == 0);
  CHECK(dgx2.broadcast_seconds(1e9, 1) == 0);

  // Four DGX A100s: 32 ranks fill them; the nodes' 8 HDR NICs (200e9 B/s)
  // are slower than NVLink (300e9), and a step costs the 5 us of InfiniBand.
  Cluster a100 = Cluster::preset("dgx-a100");
  a100.nodes = 4;
  CHECK(a100.all_reduce_seconds(1e9, 32) == Approx(2 * 31 * 5e-6 + 2.0 * 31 / 32 * 1e9 / 200e9));  // 0.0099975 s
  CHECK(a100.all_reduce_seconds(1e9, 32) == Approx(0.0099975));
  // 20 ranks: two full nodes and 4 GPUs of a third, which reach half its NICs.
  CHECK(a100.reduce_scatter_seconds(1e9, 20) == Approx(19 * 5e-6 + 19.0 / 20 * 1e9 / 100e9));  // 0.009595 s
  // Within one node the NICs play no part.
  CHECK(a100.all_gather_seconds(1e9, 8) == Approx(7 * 2e-6 + 7.0 / 8 * 1e9 / 300e9));

  CHECK(dgx2.h2d_seconds(15.75e9) == Approx(1 + 10e-6));
  CHECK(dgx2.d2h_seconds(0) == Approx(10e-6));
  // The node's 24e9 B/s of NVMe shared by 16 GPUs reading at once.
  CHECK(dgx2.nvme_read_seconds(1.5e9, 16) == Approx(100e-6 + 1.5e9 / (24e9 / 16)));
  CHECK(dgx2.nvme_write_seconds(1e9, 1) == Approx(100e-6 + 1e9 / 16e9));

  CHECK_THROWS_WITH(dgx2.all_reduce_seconds(1e9, 17), Catch::Contains("17 ranks") && Catch::Contains("1 to 16"));
  CHECK_THROWS_WITH(dgx2.all_reduce_seconds(1e9, 0), Catch::Contains("0 ranks"));
  CHECK_THROWS_WITH(dgx2.all_gather_seconds(-1, 2), Catch::Contains("-1 bytes"));
  CHECK_THROWS_WITH(dgx2.nvme_read_seconds(1e9, 17), Catch::Contains("17 GPUs sharing"));
  Cluster no_network = dgx2;
  no_network.nodes = 2;
  no_network.internode_bytes_per_s = 0;  // built by hand: from_json refuses it
  CHECK(no_network.all_reduce_seconds(1e9, 16) == dgx2.all_reduce_seconds(1e9, 16));
  CHECK_THROWS_WITH(no_network.all_reduce_seconds(1e9, 17), Catch::Contains("internode_bytes_per_s is 0"));
}

TEST_CASE("collective costs: more bytes never cost less, more nodes never move a byte faster, and all-reduce is reduce-scatter plus all-gather", "[cluster]") {
  const std::vector<double> sizes = {0, 1, 1e3, 1e6, 3e7, 1e9, 1e11};
  for (const auto& name : cluster_preset_names) {
    Cluster c = Cluster::preset(name);
    c.nodes = 4;
    int g = c.gpus_per_node;
    INFO(name);
    for (int p : {1, 2, g - 1, g, g + 1, 2 * g, 3 * g + 1, 4 * g}) {
      INFO(p << " ranks");
      double prev[4] = {-1, -1, -1, -1};
      for (double b : sizes) {
        double t[4] = {c.all_reduce_seconds(b, p), c.reduce_scatter_seconds(b, p), c.all_gather_seconds(b, p),
                       c.broadcast_seconds(b, p)};
        for (int i = 0; i < 4; ++i) {
          CHECK(t[i] >= prev[i]);
          prev[i] = t[i];
        }
        CHECK(t[0] == Approx(t[1] + t[2]).epsilon(1e-12));
      }
    }
    // Bus bandwidth (2(p-1)/p bytes moved per rank, over the time) on a
    // full node bounds every multi-node ring's, at every size.
    for (double b : {1e3, 1e6, 1e9, 1e11}) {
      auto busbw = [&](int p) { return 2.0 * (p - 1) / p * b / c.all_reduce_seconds(b, p); };
      for (int p : {g + 1, 2 * g, 3 * g + 1, 4 * g}) CHECK(busbw(p) <= busbw(g));
    }
  }
}

TEST_CASE("a cluster's device profile is one of its GPUs", "[cluster]") {
  Cluster h100 = Cluster::preset("dgx-h100");
  frugal::DeviceProfile p = h100.device_profile(DType::bf16);
  CHECK(p.backend == "cuda");
  CHECK(p.gemm_flops == 989.5e12);
  CHECK(h100.device_profile(DType::f32).gemm_flops == 67e12);
  CHECK(h100.device_profile(DType::f32, true).gemm_flops == 494.5e12);
  CHECK(p.stream_bytes == 3.35e12);
  CHECK(p.copy_bytes == 63e9);
  CHECK(p.nvme_read_bytes == Approx(48e9 / 8));
  CHECK(p.nvme_write_bytes == Approx(24e9 / 8));
  CHECK(p.threads == 112 / 8);
  CHECK(p.has_nvme());
  // The profile survives its own JSON (what frugal-plan --profile reads).
  CHECK(frugal::DeviceProfile::from_json(p.to_json(), "p").gemm_flops == p.gemm_flops);
  CHECK_THROWS_WITH(h100.flops(DType::f64), Catch::Contains("no flop/s for f64"));
  CHECK(Cluster::preset("dgx-h200").hbm_bytes == 141e9);
  CHECK(Cluster::preset("dgx-h200").hbm_bytes_per_s == 4.8e12);
  CHECK(Cluster::preset("dgx2").total_gpus() == 16);
}

TEST_CASE("ZeRO's model-state formulas give the paper's Table 1 and Table 2", "[cluster]") {
  namespace z = cluster_refs::zero;
  for (const auto& r : z::kTable1) {
    INFO(r.psi << " parameters, N = " << r.dp);
    double n = r.dp;
    CHECK(cluster_matches_printed(z::pos_bytes(r.psi, n) / 1e9, r.pos_gb, r.pos_dec));
    CHECK(cluster_matches_printed(z::pos_g_bytes(r.psi, n) / 1e9, r.pos_g_gb, r.pos_g_dec));
    CHECK(cluster_matches_printed(z::pos_g_p_bytes(r.psi, n) / 1e9, r.pos_g_p_gb, r.pos_g_p_dec));
    if (r.dp == 1) CHECK(z::baseline_bytes(r.psi) / 1e9 == Approx(r.pos_gb));
  }
  // The check can fail: with K = 16 the N = 64 figure for P_os would be 31.9.
  CHECK_FALSE(cluster_matches_printed((4 * 7.5e9 + 16 * 7.5e9 / 64) / 1e9, 31.4, 1));
  // Table 2, MP = 1 on 64 GPUs of 32 GB: the largest psi whose model states
  // fit, in billions to the table's one decimal (the other rows are MP times
  // these, as the table prints them).
  const auto& t = z::kTable2[0];
  double gpu = z::kV100Bytes;
  CHECK(cluster_matches_printed(gpu / z::baseline_bytes(1) / 1e9, t.baseline / 1e9, 1));
  CHECK(cluster_matches_printed(gpu / z::pos_bytes(1, t.gpus) / 1e9, t.pos / 1e9, 1));
  CHECK(cluster_matches_printed(gpu / z::pos_g_bytes(1, t.gpus) / 1e9, t.pos_g / 1e9, 1));
  CHECK(cluster_matches_printed(gpu / z::pos_g_p_bytes(1, t.gpus) / 1e9, t.pos_g_p / 1e9, 1));
  for (const auto& r : z::kTable2) CHECK(r.pos == Approx(r.mp * t.pos));
}

TEST_CASE("the DeepSpeed estimator ports print what DeepSpeed's docs print", "[cluster]") {
  namespace ds = cluster_refs::deepspeed;
  // docs/code-docs/source/memory.rst: estimate_zero3_model_states_mem_needs_all_cold(
  //   total_params=2851e6, largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1)
  struct Row {
    bool offload_param, offload_optimizer, zero_init;
    const char *cpu, *gpu;
  };
  for (const Row& r : std::vector<Row>{{true, true, true, "71.69", "0.12"},
                                       {true, true, false, "127.45", "0.12"},
                                       {false, true, true, "63.72", "0.78"},
                                       {false, true, false, "127.45", "0.78"},
                                       {false, false, true, "1.43", "6.09"},
                                       {false, false, false, "127.45", "6.09"}}) {
    INFO("offload_param " << r.offload_param << ", offload_optimizer " << r.offload_optimizer << ", zero_init "
                          << r.zero_init);
    auto m = ds::estimate_zero3_model_states_mem_needs(2851e6, 32e6, 8, 1, r.offload_optimizer, r.offload_param,
                                                       r.zero_init);
    CHECK(cluster_gib2(m.cpu_bytes) == r.cpu);
    CHECK(cluster_gib2(m.gpu_bytes) == r.gpu);
  }
  // The same page, ZeRO-2 (total_params=2851e6, 8 GPUs): "127.45GB | 5.31GB |
  // offload_optimizer=cpu" and "127.45GB | 15.93GB | offload_optimizer=none".
  auto z2 = ds::estimate_zero2_model_states_mem_needs(2851e6, 8, 1, true);
  CHECK(cluster_gib2(z2.cpu_bytes) == "127.45");
  CHECK(cluster_gib2(z2.gpu_bytes) == "5.31");
  // Without offload the page shows the estimator before PR #5099...
  auto old = ds::estimate_zero2_model_states_mem_needs_before_5099(2851e6, 8, 1, false);
  CHECK(cluster_gib2(old.cpu_bytes) == "127.45");
  CHECK(cluster_gib2(old.gpu_bytes) == "15.93");
  // ...today's gives 2 * 2851e6 + 18 * 2851e6 / 8 = 12.117e9 bytes = 11.28 GiB.
  auto now = ds::estimate_zero2_model_states_mem_needs(2851e6, 8, 1, false);
  CHECK(now.gpu_bytes == 2 * 2851000000ll + 18 * 2851000000ll / 8);
  CHECK(cluster_gib2(now.gpu_bytes) == "11.28");

  // The Hugging Face Transformers DeepSpeed guide ("Memory requirements")
  // prints estimate_zero3_model_states_mem_needs_all_live for bigscience/T0_3B
  // ("2783M total params, 65M largest layer params"). The exact counts, from
  // its config (T5 v1.1 XL: d_model 2048, d_ff 5120 gated, 24 + 24 layers,
  // 32 heads of 64, vocabulary 32128, untied head not in AutoModel):
  //   shared embedding 32128 * 2048                          =    65,798,144 (the largest layer)
  //   encoder layer: attention 4 * 2048^2 + gated FF 3 * 2048 * 5120 + 2 norms
  //                = 16,777,216 + 31,457,280 + 4,096      =    48,238,592, * 24
  //   decoder layer: two attentions + FF + 3 norms         =    65,017,856, * 24
  //   relative position biases 2 * 32 * 32, final norms 2 * 2048
  const double shared = 32128.0 * 2048;
  const double total = shared + 24 * 48238592.0 + 24 * 65017856.0 + 2 * 1024 + 2 * 2048;
  REQUIRE(total == 2783959040.0);
  CHECK(std::int64_t(total / 1e6) == 2783);
  CHECK(std::int64_t(shared / 1e6) == 65);
  struct Printed {
    int gpus;
    bool offload_param, offload_optimizer, zero_init;
    const char *cpu, *gpu;
  };
  for (const Printed& r : std::vector<Printed>{{1, true, true, true, "70.00", "0.25"},
                                               {1, true, true, false, "70.00", "0.25"},
                                               {1, false, true, true, "62.23", "5.43"},
                                               {1, false, true, false, "62.23", "5.43"},
                                               {1, false, false, true, "0.37", "46.91"},
                                               {1, false, false, false, "15.56", "46.91"},
                                               {2, true, true, true, "70.00", "0.25"},
                                               {2, false, true, true, "62.23", "2.84"},
                                               {2, false, false, true, "0.74", "23.58"},
                                               {2, false, false, false, "31.11", "23.58"}}) {
    INFO(r.gpus << " GPUs, offload_param " << r.offload_param << ", offload_optimizer " << r.offload_optimizer
                << ", zero_init " << r.zero_init);
    auto m = ds::estimate_zero3_model_states_mem_needs(total, shared, r.gpus, 1, r.offload_optimizer,
                                                       r.offload_param, r.zero_init);
    CHECK(cluster_gib2(m.cpu_bytes) == r.cpu);
    CHECK(cluster_gib2(m.gpu_bytes) == r.gpu);
  }
}

TEST_CASE("ZeRO-Infinity's claims are consistent with the dgx2 preset", "[cluster]") {
  namespace zi = cluster_refs::zero_infinity;
  Cluster dgx2 = Cluster::preset("dgx2");
  // "over 25 petaflops on 512 NVIDIA V100 GPUs (40% of peak)": of the
  // preset's 125 Tflop/s fp16 peak per GPU.
  double fraction = zi::kSustainedFlops / (zi::kSustainedGpus * dgx2.flops(DType::f16));
  CHECK(fraction == Approx(zi::kFractionOfPeak).margin(0.015));
  CHECK(zi::kPerGpuFlops * zi::kSustainedGpus > zi::kSustainedFlops);
  // A trillion parameters' model states (ZeRO's 16 bytes each) fit one
  // DGX-2 only with NVMe: not in its GPUs and DRAM together.
  double states = cluster_refs::zero::baseline_bytes(zi::kOneNodeParams);
  double gpus_and_dram = dgx2.total_gpus() * dgx2.hbm_bytes + dgx2.host_bytes;
  CHECK(states > gpus_and_dram);
  CHECK(states < gpus_and_dram + dgx2.nvme_bytes);
  // Likewise 32 trillion on 32 nodes.
  dgx2.nodes = zi::kLargest32Nodes;
  double states32 = cluster_refs::zero::baseline_bytes(zi::kLargestParams32Nodes);
  CHECK(states32 > dgx2.nodes * gpus_and_dram);
  CHECK(states32 < dgx2.nodes * (gpus_and_dram + dgx2.nvme_bytes));
}
