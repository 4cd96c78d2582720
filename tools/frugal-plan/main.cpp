// frugal-plan: plans a model's training step without running it, and shows
// the plan: peak, lower bound, what is live at the peak, memory by category,
// and (with --svg) the memory timeline.
//
//   frugal-plan --model mlp|gpt|gcn|resnet [--batch N] [--layers N] [--width N]
//               [--dtype f32|f64] [--optimizer adamw|sgd] [--seq N] [--heads N]
//               [--vocab N] [--tiles O[xI]] [--features N] [--classes N] [--image N] [--no-reorder]
//               [--no-inplace] [--no-fuse] [--least-saved] [--budget BYTES|N%] [--host BYTES] [--nvme-dir DIR]
//               [--profile FILE] [--svg FILE] [--json] [--ranks N [--zero auto|0|1|2|3]
//               [--overlap auto|0|1]] [--offload auto|0|1|nvme|nvme+params] [--nvme-slots 1|2]
//
// With --ranks N, the step of each of N data-parallel ranks (each on a batch
// of --batch rows) is planned as under mpirun, at the ZeRO stage --zero pins
// or the planner picks, and a table shows per rank what its device bytes
// are: parameters, optimizer state, and at the peak gradients, activations,
// scratch and communication buffers; then per tier what lives on the host
// and NVMe. --budget is then each rank's. --overlap pins whether the
// gradients' collectives run beside compute (CompileOptions::
// overlap_collectives; auto: where a core is free for them), which holds
// gradients and scratch longer.
//
// --offload pins optimizer offload (CompileOptions::offload_optimizer): 1
// keeps the optimizer state on the host, where its update runs; 0 keeps it
// on the device; auto (the default) lets the budget solve move it there
// where the budget binds. nvme pins its home to the NVMe file between steps
// (ZeRO-Infinity; needs --nvme-dir), nvme+params the parameters' too; with
// --nvme-dir the budget solve may also choose that itself. --nvme-slots 1
// writes each update back in place, as ZeRO-Infinity does: half the NVMe of
// the default 2, which keep the state a failed step started from
// (NvmeHomeOptions::slots).
//
// With --budget (bytes such as 48MiB, or a percentage of the unconstrained
// device bytes), it shows the budget solver's decisions; an infeasible
// budget exits with status 1 and names the smallest feasible one.
// --profile FILE prices the decisions with another machine's DeviceProfile
// (the JSON `frugal-info --calibrate` writes and caches): the plan that
// machine would get. The smallest feasible budget does not depend on it.
//
// frugal-plan --simulate CLUSTER plans a training step for a cluster that
// is not here and runs the plan in virtual time (tools/frugal-plan/
// simulate.hpp): CLUSTER is a JSON file (plan/cluster.hpp; the presets are
// in tools/frugal-plan/clusters/) or a preset's name, --nodes N scales it;
// --model takes a published shape (gpt2-124m ... gpt3-175b, zinf-10b ...
// zinf-20t) or a family with its flags. Each of --ranks N (default: every
// GPU) data-parallel ranks gets its GPU's memory as device budget (--budget
// lowers it) and its share of the node's RAM and NVMe; the model is built of
// meta tensors, in bf16 (f16 on a GPU without bf16) with f32 master weights
// unless --dtype / --no-master-weights say otherwise. It prints per tier
// what rank 0 and the last rank hold, the ZeRO stage, offload and budget
// decisions with their reasons, the step time, tokens/s and TFLOP/s per GPU
// the simulation predicts, and the largest model at this width that fits
// (--no-largest skips that search). A model that does not fit exits with
// status 1, naming what runs out and by how much.
//
// --tiles O[xI] holds every Linear of an mlp or gpt as O x I tiles
// (nn::LinearTiling, ZeRO-Infinity's memory-centric tiling): each tile its
// own parameter, gathered, differentiated and reduce-scattered alone, which
// is what lets a layer larger than a device train (zinf-20t: one weight
// gradient is 60.5 GiB, a V100 holds 32).
//
// frugal-plan --simulate local --ranks N plans the step of each rank of an
// MPI job on this machine (mpirun -np N; --threads T each, by default as the
// samples pick them, on --cores C, by default this machine's) and runs rank
// 0's in virtual time, priced by this machine's calibrated rates (or
// --profile FILE): the per-rank table of --ranks N and the predicted step
// time (tools/frugal-plan/simulate_local.hpp).
#include <fstream>
#include <iostream>

#include <frugal/dist/plan_only.hpp>
#include <frugal/runtime/profile_cache.hpp>

#include "../model_zoo.hpp"
#include "simulate.hpp"
#include "simulate_local.hpp"

using namespace frugal;

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "frugal-plan: " << why
            << "\nusage: frugal-plan --model mlp|gpt|gcn|resnet [--batch N] [--layers N] [--width N] [--dtype f32|f64]\n"
               "                   [--optimizer adamw|sgd] [--seq N] [--heads N] [--vocab N] [--tiles O[xI]] [--features N]\n"
               "                   [--classes N] [--image N] [--no-reorder] [--no-inplace] [--no-fuse] [--least-saved]\n"
               "                   [--budget BYTES|N%] [--host BYTES] [--nvme-dir DIR] [--profile FILE]\n"
               "                   [--svg FILE] [--json] [--ranks N [--zero auto|0|1|2|3] [--overlap auto|0|1]]\n"
               "                   [--offload auto|0|1|nvme|nvme+params] [--nvme-slots 1|2]\n"
               "       frugal-plan --simulate CLUSTER.json|dgx2|dgx-a100|dgx-h100|dgx-h200 [--nodes N]\n"
               "                   --model PRESET|mlp|gpt|gcn|resnet [model flags] [--ranks N] [--budget BYTES]\n"
               "                   [--host BYTES] [--zero ...] [--offload ...] [--nvme-slots 1|2] [--dtype bf16|f16|f32]\n"
               "                   [--no-master-weights] [--tf32] [--gemm-efficiency F] [--stream-efficiency F]\n"
               "                   [--no-largest] [--json]\n"
               "       frugal-plan --simulate local --ranks N --model mlp|gpt|gcn|resnet [model flags] [--budget ...]\n"
               "                   [--zero ...] [--offload ...] [--threads T] [--cores C] [--profile FILE] [--json]\n"
               "       presets: " << zoo::preset_names() << "\n";
  std::exit(2);
}

int main(int argc, char** argv) try {
  zoo::Config c;
  CompileOptions o;
  std::string svg_path, budget_arg;
  Budget budget;
  DeviceProfile profile;
  bool json = false, have_model = false, dtype_given = false, master_given = false;
  std::string simulate_what;
  int nodes = 0;
  frugal_plan::SimulateArgs sim;
  int ranks = 0, threads = 0, cores = 0;
  std::string zero = "auto", overlap = "auto", offload = "auto";
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    auto fraction = [&]() {
      std::string v = val();
      char* end = nullptr;
      double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end || !(x > 0 && x <= 1)) usage(k + " takes a fraction in (0, 1], got '" + v + "'");
      return x;
    };
    auto num = [&]() {
      std::string v = val();
      try {
        int n = std::stoi(v);
        if (n <= 0) throw std::invalid_argument("");
        return n;
      } catch (...) {
        usage(k + " takes a positive whole number, got '" + v + "'");
      }
    };
    if (k == "--model") {
      c.family = val(), have_model = true;
      if (const zoo::Preset* p = zoo::find_preset(c.family)) zoo::apply_preset(c, *p);
    }
    else if (k == "--simulate") simulate_what = val();
    else if (k == "--nodes") nodes = num();
    else if (k == "--threads") threads = num();
    else if (k == "--cores") cores = num();
    else if (k == "--gemm-efficiency") sim.assumptions.gemm_efficiency = fraction();
    else if (k == "--stream-efficiency") sim.assumptions.stream_efficiency = fraction();
    else if (k == "--tf32") sim.assumptions.tf32 = true;
    else if (k == "--no-largest") sim.largest = false;
    else if (k == "--master-weights") c.master_weights = true, master_given = true;
    else if (k == "--no-master-weights") c.master_weights = false, master_given = true;
    else if (k == "--batch") c.batch = num();
    else if (k == "--layers") c.layers = num();
    else if (k == "--width") c.width = num();
    else if (k == "--seq") c.seq = num();
    else if (k == "--heads") c.heads = num();
    else if (k == "--vocab") c.vocab = num();
    else if (k == "--tiles") {
      // O or OxI: each Linear's weight held as O x I tiles (nn::LinearTiling).
      std::string v = val();
      const std::size_t x = v.find('x');
      try {
        std::size_t used = 0;
        c.tiling.out_splits = std::stoll(v.substr(0, x), &used);
        if (used != (x == std::string::npos ? v.size() : x)) throw std::invalid_argument("");
        c.tiling.in_splits = x == std::string::npos ? 1 : std::stoll(v.substr(x + 1), &used);
        if (x != std::string::npos && used != v.size() - x - 1) throw std::invalid_argument("");
      } catch (...) {
        usage("--tiles takes O or OxI (positive whole numbers), got '" + v + "'");
      }
      if (c.tiling.out_splits < 1 || c.tiling.in_splits < 1) usage("--tiles takes positive splits, got '" + v + "'");
    }
    else if (k == "--features") c.features = num();
    else if (k == "--classes") c.classes = num();
    else if (k == "--image") c.image = num();
    else if (k == "--optimizer") c.optimizer = val();
    else if (k == "--dtype") {
      std::string d = val();
      if (d == "f32") c.dtype = DType::f32;
      else if (d == "f64") c.dtype = DType::f64;
      else if (d == "bf16") c.dtype = DType::bf16;
      else if (d == "f16") c.dtype = DType::f16;
      else usage("--dtype takes f32, f64, bf16 or f16");
      dtype_given = true;
    } else if (k == "--no-reorder") o.plan.reorder = false;
    else if (k == "--no-inplace") o.plan.inplace = false;
    else if (k == "--fuse") o.plan.fuse = true;  // merge elementwise chains (PlanOptions::fuse, the default)
    else if (k == "--no-fuse") o.plan.fuse = false;
    else if (k == "--least-saved") o.plan.least_saved_activations = true;  // fewest forward values held for the backward
    else if (k == "--budget") budget_arg = val();
    else if (k == "--host") budget.host = parse_bytes(val());
    else if (k == "--nvme-dir") budget.nvme_dir = val();
    else if (k == "--profile") {
      profile = read_profile_file(val());  // a DataError naming the file and the field that is wrong
      o.profile = &profile;
    } else if (k == "--svg") svg_path = val();
    else if (k == "--json") json = true;
    else if (k == "--ranks") ranks = num();
    else if (k == "--zero") {
      zero = val();
      if (zero != "auto" && zero != "0" && zero != "1" && zero != "2" && zero != "3") usage("--zero takes auto, 0, 1, 2 or 3");
    }
    else if (k == "--overlap") {
      overlap = val();
      if (overlap != "auto" && overlap != "0" && overlap != "1") usage("--overlap takes auto, 0 or 1");
    }
    else if (k == "--nvme-slots") {
      o.plan.nvme_offload.slots = num();
      if (o.plan.nvme_offload.slots != 1 && o.plan.nvme_offload.slots != 2) usage("--nvme-slots takes 1 or 2");
    } else if (k == "--offload") {
      offload = val();
      if (offload != "auto" && offload != "0" && offload != "1" && offload != "nvme" && offload != "nvme+params")
        usage("--offload takes auto, 0, 1, nvme or nvme+params");
    }
    else if (k == "--help" || k == "-h") usage("plans a training step without running it");
    else usage("unknown option " + k);
  }
  if (!have_model) usage("--model is required");
  c.meta = true;  // planned, never run: no parameter or optimizer state is allocated
  if (nodes && simulate_what.empty()) usage("--nodes needs --simulate CLUSTER");

  if (zero != "auto" && !ranks && simulate_what.empty()) usage("--zero needs --ranks N or --simulate CLUSTER");
  if (zero != "auto") o.zero_stage = std::stoi(zero);
  if (overlap != "auto" && !ranks && simulate_what.empty()) usage("--overlap needs --ranks N or --simulate CLUSTER");
  if (overlap != "auto") o.overlap_collectives = overlap == "1";
  if (offload == "0" || offload == "1") o.offload_optimizer = offload == "1";
  o.plan.nvme_offload.optimizer_state = offload.starts_with("nvme");
  o.plan.nvme_offload.parameters = offload == "nvme+params";
  const bool local = simulate_what == "local";
  if ((threads || cores) && !local) usage("--threads and --cores are for --simulate local");
  if (local) {
    if (!ranks) usage("--simulate local needs --ranks N: the ranks mpirun -np N starts on this machine");
    if (nodes) usage("--nodes is for a cluster; --simulate local is this one machine");
    frugal_plan::LocalArgs l;
    l.model = c;
    l.options = o;
    l.ranks = ranks;
    l.threads = threads;
    l.cores = cores;
    if (o.profile) l.profile = profile, l.options.profile = nullptr;
    l.budget = budget;
    l.budget_arg = budget_arg;
    l.json = json;
    return frugal_plan::simulate_local(l);
  }
  if (!simulate_what.empty()) {
    sim.cluster = frugal_plan::read_cluster(simulate_what);
    if (nodes) sim.cluster.nodes = nodes;
    // Mixed precision where the GPU has it: bf16 tensor cores, else f16 (a V100).
    if (!dtype_given) c.dtype = sim.cluster.bf16_flops > sim.cluster.f32_flops ? DType::bf16 : DType::f16;
    // ...and DeepSpeed's f32 master weights beside 16-bit parameters.
    if (!master_given) c.master_weights = c.dtype == DType::bf16 || c.dtype == DType::f16;
    sim.model = c;
    sim.options = o;
    sim.ranks = ranks;
    sim.json = json;
    if (!budget_arg.empty()) sim.device_budget = parse_bytes(budget_arg);
    if (budget.host) sim.host_budget = budget.host;
    return frugal_plan::simulate(sim);
  }
  auto w = zoo::make(c);
  if (ranks) {
    const std::vector<PlannedStep> per_rank = frugal_plan::plan_every_rank(w, budget, budget_arg, o, ranks);
    if (json) std::cout << plan::ranks_json(per_rank, c.family) << "\n";
    else std::cout << "frugal-plan: " << c.name() << ", " << ranks << " data-parallel ranks\n" << plan::ranks_table(per_rank);
    return 0;
  }
  if (!budget_arg.empty()) {
    // A percentage is of the unconstrained plan, planned only when asked for.
    budget.device = budget_arg.back() == '%' ? parse_bytes(budget_arg, zoo::plan(w, {}, o).plan.total_bytes())
                                             : parse_bytes(budget_arg);
  }
  PlannedStep ps = zoo::plan(w, budget, o);
  if (!svg_path.empty()) {
    std::ofstream f(svg_path);
    f << plan::svg(*ps.graph, ps.plan, "frugal-plan: " + c.name());
    if (!f) fail("cannot write ", svg_path);
  }
  if (json) {
    std::string j = plan::json(*ps.graph, ps.plan, c.family);
    j.pop_back();  // add the configuration to the object
    std::cout << j << ",\"config\":{\"batch\":" << c.batch << ",\"layers\":" << c.layers << ",\"width\":" << c.width
              << ",\"dtype\":\"" << dtype_name(c.dtype) << "\",\"optimizer\":\"" << c.optimizer
              << "\"},\"input_bytes\":" << ps.input_bytes << "}\n";
  } else {
    std::cout << "frugal-plan: " << c.name() << "\n" << plan::summary(*ps.graph, ps.plan);
    if (!svg_path.empty()) std::cout << "memory timeline written to " << svg_path << "\n";
  }
  return 0;
} catch (const frugal::Error& e) {
  std::cerr << "frugal-plan: " << e.what() << "\n";
  return 1;
}
