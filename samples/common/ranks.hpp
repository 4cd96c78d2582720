#pragma once
// Data parallelism for the samples. Launched by mpirun (in a build with
// MPI), every rank trains on its own share of each global batch, and the
// training step averages the gradients over the ranks
// (CompileOptions::communicator), sharded at the ZeRO stage --zero pins or
// the planner picks under --budget (each rank's). Rank 0 prints, plots and
// writes the checkpoint; every rank takes part in saving it.
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>
#if defined(FRUGAL_SAMPLES_MPI)
#include <frugal/dist/mpi.hpp>
#endif

#include "cli.hpp"

namespace samples {

struct Ranks {
  std::shared_ptr<frugal::Communicator> comm;  // null: one process
  int rank = 0, size = 1;
  std::optional<int> zero;      // --zero; unset: the planner's choice
  std::optional<bool> overlap;  // --overlap; unset: the planner's choice
  std::optional<bool> offload;  // --offload 0|1; unset: the planner's choice (also without mpirun)
  bool nvme_state = false, nvme_parameters = false;  // --offload nvme, nvme+params
  bool leader() const { return rank == 0; }
  // The training step's options for this job.
  void apply(frugal::CompileOptions& o) const {
    o.communicator = comm;
    o.zero_stage = zero;
    o.overlap_collectives = overlap;
    o.offload_optimizer = offload;
    o.plan.nvme_offload.optimizer_state = nvme_state;
    o.plan.nvme_offload.parameters = nvme_parameters;
  }
  // The mean over the ranks of each rank's value, in rank order (every rank
  // calls it, and gets the same number).
  double mean(double v) const {
    if (!comm) return v;
    std::vector<double> all(static_cast<std::size_t>(size));
    comm->all_gather(&v, all.data(), 1, frugal::DType::f64, "the ranks' losses");
    double sum = 0;
    for (double x : all) sum += x;
    return sum / size;
  }
};

// Whether mpirun (Open MPI, MPICH) started this process.
inline bool started_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

inline Ranks join_ranks(const CommonArgs& a) {
  Ranks r;
  if (!a.zero.empty() && a.zero != "auto") r.zero = std::stoi(a.zero);
  if (!a.overlap.empty() && a.overlap != "auto") r.overlap = a.overlap == "1";
  if (a.offload == "0" || a.offload == "1") r.offload = a.offload == "1";
  r.nvme_state = a.offload.starts_with("nvme");
  r.nvme_parameters = a.offload == "nvme+params";
  if (!started_by_mpirun()) {
    if (!a.zero.empty())
      frugal::fail("--zero shards the training over the ranks of an MPI job: start the sample with mpirun -np N");
    if (!a.overlap.empty())
      frugal::fail("--overlap places the collectives of an MPI job: start the sample with mpirun -np N");
    return r;
  }
#if defined(FRUGAL_SAMPLES_MPI)
  auto mpi = frugal::dist::Mpi::world();
  r.rank = mpi->rank();
  r.size = mpi->size();
  r.comm = mpi;
  return r;
#else
  frugal::fail("this build of the samples has no MPI (configure with MPI found: apt-get install openmpi-bin "
               "libopenmpi-dev); run it without mpirun");
#endif
}

}  // namespace samples
