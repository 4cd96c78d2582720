#pragma once
// NCCL as a Communicator, for ranks on GPUs: every pointer it is given is
// device memory of this rank's device (the CUDA backend's arena). A program
// that includes this links NCCL and the CUDA runtime (CMake:
// find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR}),
// target_link_libraries(app PRIVATE ${NCCL_LIBRARY} CUDA::cudart)), and
// frugal's CUDA kernels (frugal_add_kernels), whose unit defines the
// rank-order sum it calls.
//
// Sums never use NCCL's own reductions, whose order of addition (rings,
// trees, the protocol chosen for the size) is the library's: as over MPI
// (dist/mpi.hpp), a reduction is an all-to-all of chunks (grouped
// ncclSend/ncclRecv), the rank-order sum of each rank's chunk on its device
// (backend/cuda/rank_order_sum.hpp, the host's arithmetic), and an
// all-gather of the chunks: the same bits on every rank, in every run, and
// as MPI gives for the same data.
//
// No collective waits forever: each is enqueued on the communicator's own
// stream and polled, and one that has not completed after
// NcclOptions::timeout_seconds aborts the NCCL communicator
// (ncclCommAbort) and fails with an error naming it, the rank and the step.
// An asynchronous NCCL error (a peer's connection lost) fails the same way
// as soon as it is seen.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../backend/cuda/check.hpp"
#include "../backend/cuda/rank_order_sum.hpp"
#include "../ops/collective.hpp"
#include "rank_order_sum.hpp"

namespace frugal::dist {

struct NcclOptions {
  double timeout_seconds = 300;
  // The CUDA device this rank uses; -1: its rank on this machine (Open
  // MPI's OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID, MPICH's
  // MPI_LOCALRANKID), modulo the devices it sees.
  int device = -1;
};

class Nccl final : public Communicator {
 public:
  // Every rank calls it at once. `bootstrap` (dist::Mpi::world() under
  // mpirun, dist::local() alone) names the ranks and carries NCCL's unique
  // id from rank 0 to the others; NCCL then connects the GPUs itself.
  static std::shared_ptr<Nccl> over(Communicator& bootstrap, NcclOptions o = {}) {
    return std::shared_ptr<Nccl>(new Nccl(bootstrap, o));
  }
  ~Nccl() override {
    if (comm_) {
      cudaSetDevice(device_);
      if (broken_) ncclCommAbort(comm_);
      else ncclCommDestroy(comm_);
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  double timeout_seconds() const { return timeout_; }
  // Any thread may call it, one at a time: each call sets the device first.
  bool serialized_threads() const override { return true; }
  int ranks_on_this_machine() const override { return local_size_; }

  void all_reduce_sum(void* data, std::size_t count, DType dtype, void* workspace, const std::string& what) override {
    if (size_ == 1 || count == 0) return;
    enter("all_reduce", what);
    const std::size_t es = dtype_size(dtype);
    auto* bytes = static_cast<char*>(data);
    auto* rows = static_cast<char*>(workspace);
    const std::size_t mine = chunk_begin(count, rank_ + 1) - chunk_begin(count, rank_);
    // Each rank's chunk r to rank r, which receives a row from every rank.
    group("all_reduce", what, [&] {
      for (int r = 0; r < size_; ++r) {
        const std::size_t at = chunk_begin(count, r), len = chunk_begin(count, r + 1) - at;
        check(ncclSend(bytes + at * es, len * es, ncclUint8, r, comm_, stream_), "all_reduce", what);
        check(ncclRecv(rows + std::size_t(r) * mine * es, mine * es, ncclUint8, r, comm_, stream_), "all_reduce", what);
      }
    });
    char* own = bytes + chunk_begin(count, rank_) * es;
    cuda::sum_in_rank_order(rows, mine, size_, dtype, own, stream_);
    // Every rank's summed chunk to every other rank.
    group("all_reduce", what, [&] {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const std::size_t at = chunk_begin(count, r), len = chunk_begin(count, r + 1) - at;
        check(ncclSend(own, mine * es, ncclUint8, r, comm_, stream_), "all_reduce", what);
        check(ncclRecv(bytes + at * es, len * es, ncclUint8, r, comm_, stream_), "all_reduce", what);
      }
    });
    wait("all_reduce", what, count * es);
  }
  std::size_t all_reduce_workspace(std::size_t count, DType dtype) const override {
    return rank_order_all_reduce_workspace(count, dtype, size_);
  }

  void reduce_scatter_sum(const void* send, void* recv, std::size_t count, DType dtype, void* workspace,
                          const std::string& what) override {
    const std::size_t es = dtype_size(dtype);
    enter("reduce_scatter", what);
    if (size_ == 1) {
      if (send != recv) cuda::check(cudaMemcpyAsync(recv, send, count * es, cudaMemcpyDeviceToDevice, stream_),
                                    "cudaMemcpyAsync (nccl reduce_scatter, " + what + ")");
      wait("reduce_scatter", what, count * es);
      return;
    }
    const auto* from = static_cast<const char*>(send);
    auto* rows = static_cast<char*>(workspace);
    group("reduce_scatter", what, [&] {
      for (int r = 0; r < size_; ++r) {
        check(ncclSend(from + std::size_t(r) * count * es, count * es, ncclUint8, r, comm_, stream_), "reduce_scatter",
              what);
        check(ncclRecv(rows + std::size_t(r) * count * es, count * es, ncclUint8, r, comm_, stream_), "reduce_scatter",
              what);
      }
    });
    cuda::sum_in_rank_order(rows, count, size_, dtype, recv, stream_);
    wait("reduce_scatter", what, count * es * std::size_t(size_));
  }
  std::size_t reduce_scatter_workspace(std::size_t count, DType dtype) const override {
    return rank_order_reduce_scatter_workspace(count, dtype, size_);
  }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const std::string& what) override {
    const std::size_t es = dtype_size(dtype);
    enter("all_gather", what);
    check(ncclAllGather(send, recv, count * es, ncclUint8, comm_, stream_), "all_gather", what);
    wait("all_gather", what, count * es * std::size_t(size_));
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root, const std::string& what) override {
    if (root < 0 || root >= size_) fail("nccl: broadcast (", what, "): root ", root, " is not a rank of ", size_);
    const std::size_t es = dtype_size(dtype);
    enter("broadcast", what);
    check(ncclBroadcast(data, data, count * es, ncclUint8, root, comm_, stream_), "broadcast", what);
    wait("broadcast", what, count * es);
  }
  // An all-reduce of one integer in the communicator's own device scratch.
  void barrier(const std::string& what) override {
    enter("barrier", what);
    check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "barrier", what);
    wait("barrier", what, 0);
  }

 private:
  Nccl(Communicator& bootstrap, NcclOptions o)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), local_size_(bootstrap.ranks_on_this_machine()),
        timeout_(o.timeout_seconds) {
    if (!(o.timeout_seconds > 0)) fail("nccl: NcclOptions::timeout_seconds must be > 0, got ", o.timeout_seconds);
    try {
      connect(bootstrap, o);
    } catch (...) {  // the destructor does not run for a constructor that throws
      if (scratch_) cudaFree(scratch_);
      if (stream_) cudaStreamDestroy(stream_);
      throw;
    }
  }
  void connect(Communicator& bootstrap, const NcclOptions& o) {
    int devices = 0;
    cuda::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount (nccl)");
    if (devices == 0) fail("nccl: no CUDA device: NCCL's communicator needs a GPU per rank (dist::Mpi runs on CPUs)");
    device_ = o.device >= 0 ? o.device : local_rank() % devices;
    if (device_ >= devices) fail("nccl: NcclOptions::device ", device_, ", and this machine has ", devices, " devices");
    cuda::check(cudaSetDevice(device_), "cudaSetDevice (nccl)");
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (nccl)");
    cuda::check(cudaMalloc(&scratch_, sizeof(int)), "cudaMalloc (nccl barrier)");
    cuda::check(cudaMemset(scratch_, 0, sizeof(int)), "cudaMemset (nccl barrier)");
    ncclUniqueId id{};
    if (rank_ == 0) check(ncclGetUniqueId(&id), "init", "ncclGetUniqueId");
    bootstrap.broadcast(&id, sizeof id, DType::u8, 0, "NCCL's unique id, from rank 0");
    check(ncclCommInitRank(&comm_, size_, id, rank_), "init", cat("ncclCommInitRank of ", size_, " ranks"));
  }

  // Open MPI's, Slurm's and MPICH's rank on this machine, or the global one.
  int local_rank() const {
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
      if (const char* s = std::getenv(v)) return std::max(0, std::atoi(s));
    return rank_;
  }
  std::size_t chunk_begin(std::size_t count, int r) const {
    return std::size_t((unsigned __int128)count * unsigned(r) / unsigned(size_));
  }
  void enter(const char* collective, const std::string& what) {
    if (broken_)
      fail("nccl: ", collective, " (", what, ") at rank ", rank_, ": an earlier collective failed and aborted the "
           "communicator; the job cannot continue");
    cuda::check(cudaSetDevice(device_), "cudaSetDevice (nccl)");
  }
  template <class Fn>
  void group(const char* collective, const std::string& what, Fn&& enqueue) {
    check(ncclGroupStart(), collective, what);
    enqueue();
    check(ncclGroupEnd(), collective, what);
  }
  void check(ncclResult_t r, const char* collective, const std::string& what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    broken_ = true;
    fail("nccl: ", collective, " (", what, ") failed at rank ", rank_, " of ", size_, ": ", ncclGetErrorString(r));
  }
  void wait(const char* collective, const std::string& what, std::size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    for (long polls = 0;; ++polls) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        broken_ = true;
        cuda::check(e, cat("nccl ", collective, " (", what, ") at rank ", rank_));
      }
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &async), collective, what);
      if (async != ncclSuccess && async != ncclInProgress) {  // a peer's connection lost
        broken_ = true;
        throw RankFailure(cat("nccl: ", collective, " (", what, ") at rank ", rank_, " of ", size_, ": ",
                              ncclGetErrorString(async)));
      }
      if (polls < 2000) continue;  // most finish within microseconds of the last rank arriving
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_) {
        broken_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw RankFailure(cat("nccl: ", collective, " (", what, ", ", bytes, " bytes) did not complete within ",
                              timeout_, " s at rank ", rank_, " of ", size_, ": another rank has died, stopped or is "
                              "stuck. This rank's NCCL communicator is aborted: the job cannot continue on it, an "
                              "elastic job (dist/elastic.hpp) builds another over the survivors (NcclOptions::"
                              "timeout_seconds sets the limit)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int* scratch_ = nullptr;
  int rank_ = 0, size_ = 1, local_size_ = 1, device_ = 0;
  double timeout_;
  bool broken_ = false;
};

}  // namespace frugal::dist
