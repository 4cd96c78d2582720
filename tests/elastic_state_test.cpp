// Issue 23: what an elastic job moves between ranks instead of files (the
// state cut into slices, io/state_slices.hpp), the sample stream it draws
// from (data::EpochStream) and its batch policy (dist::ScalingPolicy). The
// MPI membership itself runs under mpirun: tests/dist/elastic_*.cmake.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include <frugal/dist/scaling_policy.hpp>
#include <frugal/frugal.hpp>
#include <frugal/io/state_slices.hpp>

#include "thread_ranks.hpp"
#include "bytes_of.hpp"

using namespace frugal;

namespace {

constexpr std::int64_t kVocab = 11, kSeq = 8, kGlobal = 12;

nn::GptConfig tiny_gpt() { return {.vocab = kVocab, .context = kSeq, .layers = 1, .d_model = 16, .heads = 2}; }

// Tokens of step `s`, rows [first, first + rows) of its global batch.
std::array<Tensor, 2> tokens(std::int64_t s, std::int64_t first, std::int64_t rows) {
  std::array<Tensor, 2> xy{Tensor({rows, kSeq}, DType::i32), Tensor({rows, kSeq}, DType::i32)};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < kSeq; ++t) {
      const std::int64_t k = (s * 131 + (first + r) * 17 + t * 7) % kVocab;
      xy[0].data<std::int32_t>()[r * kSeq + t] = std::int32_t(k);
      xy[1].data<std::int32_t>()[r * kSeq + t] = std::int32_t((k * 3 + 1) % kVocab);
    }
  return xy;
}

struct Rank {
  std::unique_ptr<nn::Gpt> model;
  std::unique_ptr<optim::AdamW> opt;
  std::optional<Step> step;
};

Rank make_rank(std::shared_ptr<Communicator> comm, int stage, std::int64_t rows) {
  Rank k;
  nn::manual_seed(5);
  k.model = std::make_unique<nn::Gpt>(tiny_gpt());
  k.opt = std::make_unique<optim::AdamW>(k.model->parameters(), optim::AdamWOptions{.lr = 1e-2});
  CompileOptions o{.threads = 1, .replan = false};
  if (comm) o.zero_stage = stage;
  o.communicator = std::move(comm);
  k.step.emplace(compile([&](Var x, Var y) { return k.model->loss(x, y); },
                         {input<std::int32_t>({rows, kSeq}), input<std::int32_t>({rows, kSeq})}, *k.opt, Budget{}, o));
  return k;
}

float train(Rank& k, int rank, int ranks, std::int64_t from, std::int64_t to) {
  float loss = 0;
  const std::int64_t rows = kGlobal / ranks;
  for (std::int64_t s = from; s < to; ++s) {
    auto xy = tokens(s, rank * rows, rows);
    loss = k.step->run(xy[0], xy[1]);
  }
  return loss;
}

// Every rank's slice after `steps` steps at `ranks` ranks and ZeRO `stage`,
// in rank order; `gathered` (if set) receives save_gathered_checkpoint's file.
std::vector<io::StateSlice> trained_slices(int ranks, int stage, std::int64_t steps,
                                           const std::filesystem::path& gathered = {}) {
  std::vector<io::StateSlice> slices(static_cast<std::size_t>(ranks));
  const auto errors = test_support::run_ranks(ranks, [&](int r, std::shared_ptr<Communicator> c) {
    Rank k = make_rank(c, stage, kGlobal / ranks);
    train(k, r, ranks, 0, steps);
    slices[std::size_t(r)] = io::capture_slice(*k.model, *k.opt, r, ranks, k.opt->steps(), {{"samples", "36"}});
    if (!gathered.empty()) io::save_gathered_checkpoint(gathered, *k.model, *k.opt, k.opt->steps(), *c);
  });
  for (const auto& e : errors) REQUIRE(e.empty());
  return slices;
}

}  // namespace

TEST_CASE("elastic: the slices of every rank, at any ZeRO stage and rank count, assemble to the gathered checkpoint") {
  const auto dir = std::filesystem::temp_directory_path() / "frugal_elastic_state_test";
  std::filesystem::create_directories(dir);
  for (int ranks : {1, 2, 3})
    for (int stage : {0, 1, 2, 3}) {
      INFO(ranks << " ranks, stage " << stage);
      const auto file = dir / "gathered.safetensors";
      const auto slices = trained_slices(ranks, stage, 3, file);
      // Each rank's slice is its share of the state: the slices' bytes add up to it once.
      std::size_t total = 0;
      for (const auto& s : slices) total += s.bytes.size();
      Rank alone = make_rank(nullptr, 0, kGlobal);
      const io::SafetensorsFile whole = io::assemble_slices(slices, *alone.model, *alone.opt, "test");
      std::size_t whole_bytes = 0;
      for (auto& [n, t] : whole.tensors) whole_bytes += t.nbytes();
      CHECK(total == whole_bytes);
      CHECK(whole.metadata.at("step") == "3");
      CHECK(whole.metadata.at("samples") == "36");
      // The same tensors, the same bits, as the gathered checkpoint of the same run.
      const io::SafetensorsFile file_contents = io::read_safetensors(file);
      REQUIRE(file_contents.tensors.size() == whole.tensors.size());
      for (auto& [name, t] : whole.tensors) {
        INFO(name);
        REQUIRE(file_contents.contains(name));
        CHECK(same_raw_bytes(file_contents.at(name), t));
      }
    }
  std::filesystem::remove_all(dir);
}

TEST_CASE("elastic: a state moved to another rank count and stage is the same state, and trains on as before") {
  // Trained at 3 ranks, stage 3; moved to (1, 0), (1, 1) (ZeRO over one rank
  // holds its state flat), (2, 1), (2, 2), (4, 3), (3, 0).
  const auto from = trained_slices(3, 3, 3);
  Rank alone = make_rank(nullptr, 0, kGlobal);
  const io::SafetensorsFile want = io::assemble_slices(from, *alone.model, *alone.opt, "test");
  // The 3-rank run going on: its loss at step 3.
  std::vector<float> going_on(3);
  for (const auto& e : test_support::run_ranks(3, [&](int r, std::shared_ptr<Communicator> c) {
         Rank k = make_rank(c, 3, kGlobal / 3);
         going_on[std::size_t(r)] = train(k, r, 3, 0, 4);
       }))
    REQUIRE(e.empty());
  for (auto [ranks, stage] : std::vector<std::pair<int, int>>{{1, 0}, {1, 1}, {2, 1}, {2, 2}, {4, 3}, {3, 0}}) {
    INFO("to " << ranks << " ranks at stage " << stage);
    std::vector<io::StateSlice> again(static_cast<std::size_t>(ranks));
    std::vector<float> losses(static_cast<std::size_t>(ranks));
    std::vector<std::uint64_t> hashes(static_cast<std::size_t>(ranks));
    const auto errors = test_support::run_ranks(ranks, [&](int r, std::shared_ptr<Communicator> c) {
      nn::manual_seed(77);  // other weights: the load must replace them
      Rank k = make_rank(c, stage, kGlobal / ranks);
      const io::SafetensorsFile whole = io::assemble_slices(from, *k.model, *k.opt, "test");
      hashes[std::size_t(r)] = io::state_hash(whole);
      const io::TrainingState st = io::load_whole_state(whole, *k.model, *k.opt, r, ranks, "test");
      REQUIRE(st.step == 3);
      k.step->set_steps_run(st.step);
      k.step->parameters_changed();
      again[std::size_t(r)] = io::capture_slice(*k.model, *k.opt, r, ranks, k.opt->steps(), st.metadata);
      losses[std::size_t(r)] = train(k, r, ranks, 3, 4);
    });
    for (const auto& e : errors) REQUIRE(e.empty());
    for (std::uint64_t h : hashes) CHECK(h == io::state_hash(want));
    const io::SafetensorsFile got = io::assemble_slices(again, *alone.model, *alone.opt, "test");
    CHECK(io::state_hash(got) == io::state_hash(want));
    for (std::size_t i = 0; i < got.tensors.size(); ++i)
      CHECK(same_raw_bytes(got.tensors[i].second, want.tensors[i].second));
    // Step 3's mean loss over the same 12 rows: only the order of the
    // gradient sums differs from the 3-rank run's, so the losses agree to
    // float rounding (1e-5 relative bounds a few ulps of a sum of 12).
    double mean = 0, mean_on = 0;
    for (float l : losses) mean += l / ranks;
    for (float l : going_on) mean_on += l / 3;
    CHECK(std::abs(mean - mean_on) <= 1e-5 * std::abs(mean_on));
  }
}

TEST_CASE("elastic: slices that are damaged, foreign or of different steps are refused, naming what is wrong") {
  const auto slices = trained_slices(2, 1, 1);
  Rank k = make_rank(nullptr, 0, kGlobal);
  const std::vector<char> bytes = io::encode_slice(slices[1]);
  const io::StateSlice back = io::decode_slice(bytes.data(), bytes.size(), "test");
  CHECK((back.bytes == slices[1].bytes && back.rank == 1 && back.ranks == 2 && back.step == 1 &&
         back.metadata == slices[1].metadata && back.layout == slices[1].layout));
  CHECK_THROWS_WITH(io::decode_slice(bytes.data(), bytes.size() - 3, "test"), Catch::Contains("ends early"));
  std::vector<char> longer = bytes;
  longer.push_back(0);
  CHECK_THROWS_WITH(io::decode_slice(longer.data(), longer.size(), "test"), Catch::Contains("follow the state slice"));
  CHECK_THROWS_WITH(io::decode_slice("JUNKJUNKJUNK", 12, "test"), Catch::Contains("not a frugal state slice"));

  auto other_step = slices;
  other_step[1].step = 2;
  CHECK_THROWS_AS(io::assemble_slices(other_step, *k.model, *k.opt, "test"), DataError);
  auto short_slice = slices;
  short_slice[0].bytes.pop_back();
  CHECK_THROWS_WITH(io::assemble_slices(short_slice, *k.model, *k.opt, "test"), Catch::Contains("where its share"));
  auto swapped = std::vector<io::StateSlice>{slices[1], slices[0]};
  CHECK_THROWS_WITH(io::assemble_slices(swapped, *k.model, *k.opt, "test"), Catch::Contains("not rank 0's"));
  // Another model: a wider one has other shapes.
  nn::manual_seed(5);
  nn::Gpt wide({.vocab = kVocab, .context = kSeq, .layers = 1, .d_model = 32, .heads = 2});
  optim::AdamW wide_opt(wide.parameters(), {.lr = 1e-2});
  CHECK_THROWS_WITH(io::assemble_slices(slices, wide, wide_opt, "test"), Catch::Contains("of another state"));
  // A rank's shard cut over another rank count is not its slice.
  CHECK_THROWS_WITH(io::capture_slice(*k.model, *k.opt, 0, 0, 0), Catch::Contains("is not a rank"));
  CHECK_THROWS_WITH(io::capture_slice(*k.model, *k.opt, 0, 1, 0, {{"step", "1"}}), Catch::Contains("reserved"));
}

TEST_CASE(
    "elastic: the scaling policy keeps the global batch while the ranks divide it, else scales the learning rate") {
  dist::ScalingPolicy p{.global_batch = 12};
  for (int n : {1, 2, 3, 4, 6, 12}) {
    const auto at = p.at(n);
    CHECK((at.rank_batch * n == 12 && at.global_batch == 12 && at.lr_scale == 1.0));
  }
  // 5 ranks: 12/5 rounds to 2 a rank, 10 in all; Adam's square-root rule.
  auto five = p.at(5);
  CHECK((five.rank_batch == 2 && five.global_batch == 10));
  CHECK(five.lr_scale == Approx(std::sqrt(10.0 / 12.0)).epsilon(1e-15));
  p.lr_rule = dist::ScalingPolicy::LrRule::linear;
  CHECK(p.at(5).lr_scale == Approx(10.0 / 12.0).epsilon(1e-15));
  p.lr_rule = dist::ScalingPolicy::LrRule::none;
  CHECK((p.at(5).global_batch == 10 && p.at(5).lr_scale == 1.0));
  p.lr_rule = dist::ScalingPolicy::LrRule::linear;
  // At most 4 a rank: 2 ranks take 8, not 12.
  p.max_rank_batch = 4;
  auto two = p.at(2);
  CHECK((two.rank_batch == 4 && two.global_batch == 8 && two.lr_scale == Approx(8.0 / 12.0)));
  CHECK(p.at(3).global_batch == 12);
  CHECK(p.at(24).rank_batch == 1);  // never less than a sample a rank
  CHECK_THROWS_WITH((dist::ScalingPolicy{}.at(2)), Catch::Contains("global_batch must be positive"));
}

TEST_CASE("elastic: a sample stream draws each item once an epoch, however it is cut into batches") {
  data::EpochStream stream(10, 3);
  data::EpochSampler sampler(10, 5, 3);
  for (std::int64_t e = 0; e < 3; ++e) {
    std::set<std::int64_t> seen;
    for (std::int64_t p = 0; p < 10; ++p) seen.insert(stream.item(e * 10 + p));
    CHECK(seen.size() == 10);
    for (std::int64_t b = 0; b < 2; ++b)  // the same order as the batch sampler's
      for (std::int64_t i = 0; i < 5; ++i) CHECK(stream.item(e * 10 + b * 5 + i) == sampler.batch(e * 2 + b)[i]);
  }
  // Batches of 3, then 4, then 3 ranks' worth: positions continue, nothing repeats within the epoch.
  std::multiset<std::int64_t> drawn;
  std::int64_t at = 0;
  for (std::int64_t batch : {3, 4, 3}) {
    for (std::int64_t i = 0; i < batch; ++i) drawn.insert(stream.item(at + i));
    at += batch;
  }
  CHECK(std::set<std::int64_t>(drawn.begin(), drawn.end()).size() == drawn.size());
  CHECK(stream.epoch_of(at) == 1);
}
