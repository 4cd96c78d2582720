// Memory estimated before running, checked by running (the question TBEM
// answers with regression; frugal answers it from the plan).
//
// 54 configurations from an orthogonal array: a strength-2 array of 27 runs
// over GF(3)^3 for family, depth, width, batch and dtype (dtype's third level
// folded onto f32), crossed with 1 and 2 threads. Each configuration runs in
// a child process of its own, so its peak RSS is its own. For each, the plan
// predicts the arena's high-water mark and the whole process's peak; the
// child then runs audited steps and reports what it measured.
//
//   estimate [--quick]            the table (markdown) and a summary line
//   estimate --child F L W B D T  one configuration (internal)
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <map>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../tools/model_zoo.hpp"
#include "frugal/backend/cpu/blas.hpp"  // one GEMM, measured alone

using namespace frugal;

struct Row {
  zoo::Config c;
  int threads;
};

static zoo::Config config(int family, int depth, int width, int batch, int dtype) {
  zoo::Config c;
  c.family = std::array{"mlp", "gpt", "gcn"}[family];
  c.dtype = dtype == 1 ? DType::f64 : DType::f32;
  if (c.family == "mlp") {
    c.layers = std::array{1, 2, 4}[depth];
    c.width = std::array{128, 512, 1024}[width];
    c.batch = std::array{32, 128, 512}[batch];
    c.features = 784;
  } else if (c.family == "gpt") {
    c.layers = std::array{1, 2, 3}[depth];
    c.width = std::array{64, 128, 256}[width];
    c.batch = std::array{2, 4, 8}[batch];
    c.seq = 64;
    c.vocab = 256;
  } else {
    c.layers = std::array{2, 3, 4}[depth];
    c.width = std::array{16, 64, 128}[width];
    c.batch = std::array{500, 1000, 2000}[batch];  // nodes
    c.features = 256;
    c.classes = 7;
  }
  return c;
}

static std::vector<Row> design() {
  std::vector<Row> rows;
  for (int threads : {1, 2})
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b)
        for (int c = 0; c < 3; ++c)
          rows.push_back({config(a, b, c, (a + b + c) % 3, (a + 2 * b + c) % 3), threads});
  return rows;
}

// A calibration child: resident-memory growth of one square GEMM of edge n.
static int blas_child(char** argv) {
  std::int64_t n = std::stoll(argv[2]);
  DType dt = std::string(argv[3]) == "f64" ? DType::f64 : DType::f32;
  omp_set_num_threads(std::stoi(argv[4]));  // OpenBLAS follows the calling thread's OpenMP count
  Tensor a({n, n}, dt), b({n, n}, dt), c({n, n}, dt);  // zeroed, so touched
  std::size_t before = current_rss_bytes();
  if (dt == DType::f64)
    cpu::gemm(false, false, n, n, n, 1.0, a.data<double>(), n, b.data<double>(), n, 0.0, c.data<double>(), n);
  else
    cpu::gemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);
  std::printf("%zu\n", current_rss_bytes() - before);
  return 0;
}

// The child: plan, then measure.
static int child(int argc, char** argv) {
  if (argc < 9) return 2;
  zoo::Config c = config(std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]),
                         std::stoi(argv[6]));
  int threads = std::stoi(argv[7]);
  bool calibrate = std::string(argv[8]) == "calibrate";
  if (calibrate) c = {.family = "mlp", .batch = 1, .layers = 1, .width = 8, .features = 8, .classes = 2};
  auto w = zoo::make(c);
  Step step = zoo::compile(w, {}, {.threads = threads});
  const Plan& p = step.plan();
  std::size_t inputs = 0;
  for (auto& s : w.inputs) inputs += s.meta.nbytes();
  std::vector<Tensor> batch = w.batch(1);
  Step::Audit audit;
  if (batch.size() == 2) audit = step.audit(batch[0], batch[1]);
  else audit = step.audit(batch[0], batch[1], batch[2]);
  float loss = batch.size() == 2 ? step.run(batch[0], batch[1]) : step.run(batch[0], batch[1], batch[2]);
  std::printf("{\"arena_predicted\":%zu,\"arena_measured\":%zu,\"canary\":%d,\"persistent\":%zu,\"inputs\":%zu,"
              "\"peak_rss\":%zu,\"gemm_edge\":%.3f,\"loss\":%g}\n",
              p.peak_bytes, audit.high_water, int(audit.canary_intact), p.persistent_bytes, inputs, peak_rss_bytes(),
              plan::largest_gemm_edge(step.graph(), p), double(loss));
  return 0;
}

struct Measured {
  std::size_t arena_predicted = 0, arena_measured = 0, persistent = 0, inputs = 0, peak_rss = 0;
  int canary = 0;
  double gemm_edge = 0;
};

static Measured run_child(const char* self, const Row& r, int f, int d, int w, int b, int t, bool calibrate) {
  std::string cmd = std::string(self) + " --child " + std::to_string(f) + " " + std::to_string(d) + " " +
                    std::to_string(w) + " " + std::to_string(b) + " " + std::to_string(t) + " " +
                    std::to_string(r.threads) + (calibrate ? " calibrate" : " run");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) fail("cannot run ", cmd);
  Measured m;
  char line[512] = {};
  if (!std::fgets(line, sizeof line, pipe)) line[0] = 0;
  int rc = pclose(pipe);
  if (rc != 0 || std::sscanf(line,
                             "{\"arena_predicted\":%zu,\"arena_measured\":%zu,\"canary\":%d,\"persistent\":%zu,"
                             "\"inputs\":%zu,\"peak_rss\":%zu,\"gemm_edge\":%lf",
                             &m.arena_predicted, &m.arena_measured, &m.canary, &m.persistent, &m.inputs,
                             &m.peak_rss, &m.gemm_edge) != 7)
    fail("child failed (", rc, "): ", cmd, "\n", line);
  return m;
}

int main(int argc, char** argv) try {
  if (argc > 1 && std::string(argv[1]) == "--child") return child(argc, argv);
  if (argc > 4 && std::string(argv[1]) == "--blas") return blas_child(argv);
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";

  // Calibration, once for all configurations: BLAS's packing workspace as a
  // function of GEMM size (per dtype and thread count), then the runtime's
  // fixed overhead: a minimal model's peak RSS less what its plan and that
  // curve account for.
  std::map<std::pair<int, DType>, plan::WorkspaceCurve> blas;
  for (int t : {1, 2})
    for (DType dt : {DType::f32, DType::f64}) {
      auto& curve = blas[{t, dt}];
      for (int n : {16, 64, 256, 512, 1024, 2048}) {
        std::string cmd = cat(argv[0], " --blas ", n, " ", dtype_name(dt), " ", t);
        FILE* pipe = popen(cmd.c_str(), "r");
        std::size_t bytes = 0;
        if (!pipe || std::fscanf(pipe, "%zu", &bytes) != 1) fail("calibration failed: ", cmd);
        pclose(pipe);
        curve.edge.push_back(n);
        curve.bytes.push_back(bytes);
      }
      std::printf("calibration, %d thread(s), %s: BLAS workspace after an n^3 GEMM, n = 16..2048:", t,
                  dtype_name(dt));
      for (auto b : curve.bytes) std::printf(" %s", format_bytes(b).c_str());
      std::printf("\n");
    }
  std::array<std::size_t, 3> overhead{};
  for (int t : {1, 2}) {
    Measured m = run_child(argv[0], {{}, t}, 0, 0, 0, 0, 0, true);
    std::size_t accounted = m.persistent + m.arena_predicted + m.inputs + blas[{t, DType::f32}].at(m.gemm_edge);
    if (m.peak_rss < accounted) fail("calibration: the minimal model's peak RSS is below what its plan accounts for");
    overhead[std::size_t(t)] = m.peak_rss - accounted;
    std::printf("calibration, %d thread(s): runtime overhead %s\n", t, format_bytes(overhead[std::size_t(t)]).c_str());
  }

  std::printf("\n| # | config | threads | arena predicted | arena measured | process predicted | peak RSS | error |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
  auto rows = design();
  int exact = 0, within = 0, n = 0;
  double worst = 0;
  int idx = 0;
  for (int t : {1, 2})
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b)
        for (int c = 0; c < 3; ++c) {
          const Row& r = rows[std::size_t(idx++)];
          if (quick && idx % 6 != 1) continue;
          Measured m = run_child(argv[0], r, a, b, c, (a + b + c) % 3, (a + 2 * b + c) % 3, false);
          std::size_t predicted = overhead[std::size_t(t)] + m.persistent + m.arena_predicted + m.inputs +
                                  blas[{t, r.c.dtype}].at(m.gemm_edge);
          double err = (double(predicted) - double(m.peak_rss)) / double(m.peak_rss);
          exact += m.arena_predicted == m.arena_measured && m.canary;
          within += std::abs(err) <= 0.05;
          worst = std::max(worst, std::abs(err));
          ++n;
          std::printf("| %d | %s | %d | %zu | %zu | %s | %s | %+.1f%% |\n", idx, r.c.name().c_str(), t,
                      m.arena_predicted, m.arena_measured, format_bytes(predicted).c_str(),
                      format_bytes(m.peak_rss).c_str(), 100 * err);
          std::fflush(stdout);
        }
  std::printf("\n%d configurations: arena exact in %d, process within 5%% in %d, worst process error %.1f%%\n", n,
              exact, within, 100 * worst);
  return exact == n ? 0 : 1;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "estimate: %s\n", e.what());
  return 1;
}
