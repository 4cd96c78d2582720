// frugal's planner against published memory figures (issue 20): the ZeRO
// paper's model-state bytes per GPU (Table 1's formulas at N = 64) and
// DeepSpeed's own estimators, for GPTs planned with meta tensors under
// dist::PlanOnly, bf16 with f32 master weights (the papers' mixed-precision
// Adam). Prints markdown tables; the references come from
// bench/published/zero_formulas.hpp, written from the papers and DeepSpeed's
// source, not from frugal.
//
//   cmake --build build --target published_checks && ./build/bench/published_checks
#include <cstdio>

#include <frugal/dist/plan_only.hpp>
#include <frugal/frugal.hpp>

#include "../tools/model_zoo.hpp"
#include "../tests/model_states.hpp"
#include "published/zero_formulas.hpp"

using namespace frugal;

namespace {

using test_model_states::ModelStates;

// What rank `rank` of `ranks` holds of the model states at `stage`
// (tests/model_states.hpp).
ModelStates rank_states(zoo::Config c, int rank, int ranks, int stage, std::optional<bool> offload = {}) {
  c.meta = true;
  zoo::Workload w = zoo::make(c);
  CompileOptions o;
  o.communicator = std::make_shared<dist::PlanOnly>(rank, ranks);
  o.zero_stage = stage;
  o.offload_optimizer = offload;
  return test_model_states::of(zoo::plan(w, {}, o));
}

double parameters_of(zoo::Config c, double* largest_layer = nullptr) {
  c.meta = true;
  zoo::Workload w = zoo::make(c);
  double n = 0, largest = 0;
  for (const Tensor& t : w.model->parameters()) n += double(t.numel()), largest = std::max(largest, double(t.numel()));
  if (largest_layer) *largest_layer = largest;
  return n;
}

zoo::Config gpt(int layers, int width, int heads, int seq = 1024) {
  zoo::Config c;
  c.family = "gpt", c.layers = layers, c.width = width, c.heads = heads, c.seq = seq, c.batch = 1;
  c.vocab = zoo::kGpt2Vocab, c.dtype = DType::bf16, c.master_weights = true;
  return c;
}

}  // namespace

int main() {
  // ---- ZeRO, Table 1: N = 64 -------------------------------------------------------
  {
    const int n = 64;
    zoo::Config c = gpt(36, 4096, 32);  // about 7.5B parameters, the table's first model
    const double psi = parameters_of(c);
    std::printf("## ZeRO (Rajbhandari et al. 2020), model-state bytes per GPU, N = %d\n\n", n);
    std::printf("GPT of %.4gB parameters (36 layers, width 4096), bf16 parameters and gradients, AdamW with f32 master "
                "weights (K = 12). frugal: rank 0's planned bytes; formula: the paper's at frugal's psi; table: the "
                "paper's printed figure for psi = 7.5B.\n\n",
                psi / 1e9);
    std::printf("| stage | frugal rank 0 (GB) | formula at psi (GB) | frugal / formula | table, psi = 7.5B (GB) |\n");
    std::printf("|---|---|---|---|---|\n");
    const char* names[] = {"baseline", "P_os", "P_os+g", "P_os+g+p"};
    const published::zero::Table1Row* row = nullptr;
    for (const auto& r : published::zero::kTable1)
      if (r.psi == 7.5e9 && r.dp == n) row = &r;
    for (int stage = 0; stage <= 3; ++stage) {
      const double f = rank_states(c, 0, n, stage).total();
      const double paper = stage == 0   ? published::zero::baseline_bytes(psi)
                           : stage == 1 ? published::zero::pos_bytes(psi, n)
                           : stage == 2 ? published::zero::pos_g_bytes(psi, n)
                                        : published::zero::pos_g_p_bytes(psi, n);
      const double printed = stage == 0 ? 120 : stage == 1 ? row->pos_gb : stage == 2 ? row->pos_g_gb : row->pos_g_p_gb;
      std::printf("| %d (%s) | %.4f | %.4f | %.6f | %.3g |\n", stage, names[stage], f / 1e9, paper / 1e9, f / paper,
                  printed);
    }
    std::printf("\n(Rank 0 holds the first chunk of every sharded tensor, ceil(numel / N) elements, so it is at most "
                "one element per tensor above psi / N; summed over all ranks the shards are psi exactly, which "
                "tests/cluster_plan_test.cpp checks at every stage.)\n\n");
  }
  // ---- DeepSpeed's estimators ---------------------------------------------------------
  {
    const int gpus = 8;
    std::printf("## DeepSpeed's estimators, one node of %d GPUs (bytes per GPU of model states)\n\n", gpus);
    std::printf("| model | psi | stage | frugal (GB) | DeepSpeed (GB) | frugal + DeepSpeed's extra terms (GB) | ratio |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    struct M {
      const char* name;
      zoo::Config c;
    };
    for (const M& m : {M{"gpt2-1.5b", gpt(48, 1600, 25)}, M{"gpt3-13b", gpt(40, 5120, 40, 2048)},
                       M{"gpt3-175b", gpt(96, 12288, 96, 2048)}}) {
      double largest = 0;
      const double psi = parameters_of(m.c, &largest);
      // Stage 2 without offload. DeepSpeed (stage_1_and_2.py): 2 psi of fp16
      // parameters + 18 psi / N: the fp16 gradient partition (2), fp32
      // master, momentum and variance (12) and an fp32 copy of the gradient
      // partition (4), which frugal does not keep (its update reads the bf16
      // shard into f32 as it goes).
      {
        ModelStates f = rank_states(m.c, 0, gpus, 2);
        auto ds = published::deepspeed::estimate_zero2_model_states_mem_needs(psi, gpus, 1, false);
        const double same = f.total() + 4 * psi / gpus;
        std::printf("| %s | %.4gB | 2 | %.3f | %.3f | %.3f (+ fp32 gradient partition 4 psi/N) | %.6f |\n", m.name,
                    psi / 1e9, f.total() / 1e9, double(ds.gpu_bytes) / 1e9, same / 1e9, same / double(ds.gpu_bytes));
      }
      // Stage 3 without offload: 4 x largest layer (its gathered fp16
      // parameters and gradients) + 18 psi / N: the fp16 parameter
      // partition (2) and fp32 master, momentum, variance and gradient
      // partition (16), where frugal holds the gradient shard in bf16 (2).
      {
        ModelStates f = rank_states(m.c, 0, gpus, 3);
        auto ds = published::deepspeed::estimate_zero3_model_states_mem_needs(psi, largest, gpus, 1, false, false);
        const double same = f.total() + 2 * psi / gpus + 4 * largest;
        std::printf("| %s | %.4gB | 3 | %.3f | %.3f | %.3f (gradient shard in fp32, + 2 psi/N; + a gathered largest "
                    "layer, 4 x %.4gM) | %.6f |\n",
                    m.name, psi / 1e9, f.total() / 1e9, double(ds.gpu_bytes) / 1e9, same / 1e9, largest / 1e6,
                    same / double(ds.gpu_bytes));
      }
      // Stage 2 with the optimizer offloaded to the CPU: the GPU keeps the
      // fp16 parameters (2 psi); DeepSpeed counts nothing else there.
      {
        ModelStates f = rank_states(m.c, 0, gpus, 2, true);
        auto ds = published::deepspeed::estimate_zero2_model_states_mem_needs(psi, gpus, 1, true);
        std::printf("| %s | %.4gB | 2 + CPU offload | %.3f (parameters %.3f, gradient shard %.3f) | %.3f | %.3f "
                    "(parameters only) | %.6f |\n",
                    m.name, psi / 1e9, f.total() / 1e9, f.parameters / 1e9, f.gradients / 1e9,
                    double(ds.gpu_bytes) / 1e9, f.parameters / 1e9, f.parameters / double(ds.gpu_bytes));
      }
    }
    std::printf("\n");
  }
  return 0;
}
