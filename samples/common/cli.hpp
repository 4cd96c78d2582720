#pragma once
// Command-line options for the samples: each sample declares its options
// with a help line, and every sample understands the same common ones
// (budget, steps, seed, data, json, plot, checkpoints).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <frugal/frugal.hpp>

namespace samples {

class Cli {
 public:
  Cli(std::string program, std::string what) : program_(std::move(program)), what_(std::move(what)) {}

  void option(const std::string& flag, std::string& target, const std::string& help) {
    add(flag, "TEXT", help, [&target](const std::string& v) { target = v; });
  }
  void option(const std::string& flag, std::int64_t& target, const std::string& help) {
    add(flag, "N", help, [&target, flag, this](const std::string& v) { target = to_int(flag, v); });
  }
  void option(const std::string& flag, double& target, const std::string& help) {
    add(flag, "X", help, [&target, flag, this](const std::string& v) {
      std::size_t pos = 0;
      try {
        target = std::stod(v, &pos);
      } catch (...) {
        pos = 0;
      }
      if (pos == 0 || pos != v.size()) usage_error(flag + " takes a number, not '" + v + "'");
    });
  }
  void flag(const std::string& flag, bool& target, const std::string& help) {
    opts_.push_back({flag, "", help, [&target](const std::string&) { target = true; }, false});
  }

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string k = argv[i];
      if (k == "--help" || k == "-h") {
        std::cout << usage();
        std::exit(0);
      }
      const Opt* o = nullptr;
      for (const Opt& c : opts_)
        if (c.flag == k) o = &c;
      if (!o) usage_error("unknown option " + k);
      if (o->takes_value) {
        if (i + 1 >= argc) usage_error(k + " needs a value");
        o->set(argv[++i]);
      } else {
        o->set("");
      }
    }
  }

  [[noreturn]] void usage_error(const std::string& why) const {
    std::cerr << program_ << ": " << why << "\n\n" << usage();
    std::exit(2);
  }

  std::string usage() const {
    std::string s = "usage: " + program_ + " [options]\n" + what_ + "\n\noptions:\n";
    for (const Opt& o : opts_) {
      std::string left = "  " + o.flag + (o.takes_value ? " " + o.metavar : "");
      if (left.size() < 26) left.resize(26, ' ');
      else left += "\n" + std::string(26, ' ');
      s += left + o.help + "\n";
    }
    return s;
  }

 private:
  struct Opt {
    std::string flag, metavar, help;
    std::function<void(const std::string&)> set;
    bool takes_value = true;
  };
  void add(const std::string& flag, const std::string& metavar, const std::string& help,
           std::function<void(const std::string&)> set) {
    opts_.push_back({flag, metavar, help, std::move(set), true});
  }
  std::int64_t to_int(const std::string& flag, const std::string& v) const {
    std::size_t pos = 0;
    long long n = 0;
    try {
      n = std::stoll(v, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != v.size()) usage_error(flag + " takes a whole number, not '" + v + "'");
    return n;
  }

  std::string program_, what_;
  std::vector<Opt> opts_;
};

// The options every sample shares.
struct CommonArgs {
  std::string device = "cpu";  // the backend: "cpu" or "cuda" (where the program was built with CUDA)
  std::string budget;      // "", "64MiB", "40%" (of the unconstrained step's device bytes)
  std::string host;        // host pool limit, "" for none
  std::string nvme_dir;    // NVMe tier directory, "" for none
  std::int64_t steps = 0;  // 0: from epochs
  std::int64_t epochs = 0; // 0: the sample's default
  std::int64_t seed = 1;
  std::string data;
  bool json = false;
  std::string plot;
  std::string checkpoint;  // save here (atomically) every --save-every steps and at the end
  std::int64_t save_every = 0;
  std::string resume;      // continue from this checkpoint
  std::int64_t threads = 0;    // 0: default_threads()
  std::int64_t log_every = 0;  // plain-line interval when not on a terminal; 0: about 20 lines
  std::string zero;            // under mpirun: the ZeRO stage, "auto" (the planner's) or 0-3; "" when not given
  std::string overlap;         // under mpirun: gradient collectives beside compute, "auto", "0" or "1"; "" when not given
  std::string offload;         // "auto", "0", "1" (host), "nvme", "nvme+params"; "" when not given

  void declare(Cli& cli, const std::string& default_data) {
    data = default_data;
    cli.option("--device", device, "cpu or cuda: where the steps run (default cpu)");
    cli.option("--budget", budget, "device memory cap: bytes (64MiB, 1.5GiB) or N% of the unconstrained step");
    cli.option("--host", host, "host memory cap for swapped tensors (default: no cap)");
    cli.option("--nvme-dir", nvme_dir, "directory for the NVMe tier (default: no NVMe spilling)");
    cli.option("--steps", steps, "training steps (overrides --epochs)");
    cli.option("--epochs", epochs, "passes over the training data");
    cli.option("--seed", seed, "seed for initialisation, data order and dropout");
    cli.option("--data", data, "dataset directory (default " + default_data + ")");
    cli.flag("--json", json, "print one JSON summary line on stdout (progress goes to stderr)");
    cli.option("--plot", plot, "write loss curves and device memory over a step to this SVG file");
    cli.option("--checkpoint", checkpoint, "save a safetensors checkpoint here (atomically) at the end");
    cli.option("--save-every", save_every, "also save the checkpoint every N steps");
    cli.option("--resume", resume, "continue training from this checkpoint");
    cli.option("--threads", threads,
               "CPU threads (default 2, or fewer: the cores this process has, shared by mpirun's ranks on them)");
    cli.option("--log-every", log_every, "steps between progress lines when not on a terminal");
    cli.option("--zero", zero, "under mpirun: ZeRO stage auto (the planner's choice, the default), 0, 1, 2 or 3");
    cli.option("--overlap", overlap,
               "under mpirun: gradient collectives beside the backward: auto (where a core is free, the default), 0 or 1");
    cli.option("--offload", offload,
               "optimizer state on the host, where its update runs (ZeRO-Offload): auto (where the budget binds, the "
               "default), 0 or 1; or its home on NVMe between steps (ZeRO-Infinity, with --nvme-dir): nvme, or "
               "nvme+params for the f32 parameters too");
  }
  // The threads a step runs on when --threads is not given: 2, but no more
  // than the cores this process has to itself. Ranks that mpirun binds each
  // to its own cores have those; unbound ranks share the machine's. Two
  // OpenMP threads time-sliced on one core spin at each other's barriers:
  // 4 ranks x 2 threads on 2 cores measured 6x slower per step than 4 x 1.
  static int default_threads() {
    const int procs = omp_get_num_procs();  // the cores this process may run on
    int sharing = 1;
    if (procs >= int(std::thread::hardware_concurrency()))
      for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"})
        if (const char* n = std::getenv(v); n && std::atoi(n) > 0) {
          sharing = std::atoi(n);
          break;
        }
    return std::clamp(procs / sharing, 1, 2);
  }

  void check(const Cli& cli) {
    if (steps < 0 || epochs < 0 || threads < 0 || save_every < 0 || log_every < 0)
      cli.usage_error("--steps, --epochs, --save-every, --log-every and --threads cannot be negative");
    if (seed < 0) cli.usage_error("--seed must be non-negative");
    if (!zero.empty() && zero != "auto" && zero != "0" && zero != "1" && zero != "2" && zero != "3")
      cli.usage_error("--zero takes auto, 0, 1, 2 or 3");
    if (!overlap.empty() && overlap != "auto" && overlap != "0" && overlap != "1")
      cli.usage_error("--overlap takes auto, 0 or 1");
    if (!offload.empty() && offload != "auto" && offload != "0" && offload != "1" && offload != "nvme" &&
        offload != "nvme+params")
      cli.usage_error("--offload takes auto, 0, 1, nvme or nvme+params");
    if (offload.starts_with("nvme") && nvme_dir.empty())
      cli.usage_error("--offload " + offload + " keeps tensors in the NVMe tier: give it a directory with --nvme-dir");
    if (threads == 0) threads = default_threads();
  }
};

}  // namespace samples
