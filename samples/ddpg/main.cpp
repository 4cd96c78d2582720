// ddpg: DDPG on Pendulum or a 2-link reacher, with an adversary poisoning a
// fraction of the transitions entering the replay buffer and a defence that
// clusters the pool and filters suspicious transitions before sampling.
//
//   ddpg --env pendulum                          # no attack
//   ddpg --env pendulum --attack 0.2             # 20% poisoned (flips and perturbations)
//   ddpg --env pendulum --attack 0.2 --defence   # ... filtered by the defence
//   ddpg --budget 70% --json                     # all four steps within 70% of their memory
//
// --steps counts environment steps; after --warmup random steps, every step
// is one DDPG update (critic step, actor step, soft target update) on a
// batch from the buffer. The JSON line reports the return of every training
// episode, the mean of the last 10, a noise-free evaluation against random
// actions on the same episodes, and what the defence filtered.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>

#include "../common/cli.hpp"
#include "../common/json_line.hpp"
#include "../common/plot.hpp"
#include "agent.hpp"
#include "defence.hpp"
#include "envs.hpp"
#include "replay.hpp"

using namespace frugal;
using namespace ddpg;

namespace {

struct Options {
  samples::CommonArgs common;
  std::string env = "pendulum";
  std::int64_t hidden = 128, batch = 128, warmup = 1000, eval_episodes = 10, stop_after = 0, buffer = 0;
  double noise = 0.1, actor_lr = 1e-3, critic_lr = 1e-3, gamma = 0.99, tau = 0.005;
  double attack = 0, sigma = 0.5, threshold = 4.0;
  std::string attack_kind = "both";
  bool defence = false;
  std::int64_t defence_every = 250, clusters = 32;
};

// Mean return of `episodes` noise-free episodes of the policy (or of uniform
// random actions), each from its own start (reset streams apart from training's).
double evaluate(Env& env, Learner* learner, std::uint64_t seed, std::int64_t episodes) {
  double total = 0;
  std::vector<float> obs(static_cast<std::size_t>(env.obs_dim())), act(std::size_t(env.act_dim()));
  for (std::int64_t e = 0; e < episodes; ++e) {
    env.reset(seed, (std::uint64_t(1) << 32) + std::uint64_t(e));
    Rng rng(seed, kRandomPolicy + std::uint64_t(e));
    double ret = 0;
    for (;;) {
      env.observe(obs.data());
      if (learner) learner->act(obs.data(), act.data());
      else
        for (float& a : act) a = float(rng.uniform(-1, 1));
      StepResult r = env.step(act.data());
      ret += r.reward;
      if (r.terminal || r.truncated) break;
    }
    total += ret;
  }
  return episodes ? total / double(episodes) : 0;
}

double mean_last(const std::vector<double>& v, std::size_t n) {
  if (v.empty()) return std::nan("");
  const std::size_t k = std::min(n, v.size());
  double s = 0;
  for (std::size_t i = v.size() - k; i < v.size(); ++i) s += v[i];
  return s / double(k);
}

Tensor f64_tensor(const std::vector<double>& v) {
  Tensor t({std::int64_t(v.size())}, DType::f64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}
Tensor i64_tensor(const std::vector<std::int64_t>& v) {
  Tensor t({std::int64_t(v.size())}, DType::i64);
  std::copy(v.begin(), v.end(), t.data<std::int64_t>());
  return t;
}

// Everything of a run besides the networks' weights and the critic's
// optimizer: what a checkpoint must carry to continue bit for bit.
struct RunState {
  std::int64_t step = 0, episode = 0, rounds = 0;
  double ep_return = 0;
  std::vector<float> obs;
  std::vector<double> returns;
  std::vector<std::int64_t> episode_ends;
  std::vector<float> critic_loss;
  DefenceReport last;        // the latest rescoring
  std::int64_t poisoned = 0;  // transitions the adversary poisoned so far
};

std::string svg_of_run(const std::string& title, const RunState& st, const Plan& budgeted, const Plan& unconstrained,
                       double budget, double measured) {
  using samples::PlotSeries;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"760\" font-family=\"sans-serif\" "
        "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"90\" y=\"26\" "
        "font-size=\"17\" font-weight=\"bold\">"
     << xml_escape(title) << "</text>\n";
  PlotSeries raw{"episode return", "#c6d9ee", {}, {}}, avg{"mean of the last 10", "#1f77b4", {}, {}};
  double lo = 1e300, hi = -1e300;
  for (std::size_t i = 0; i < st.returns.size(); ++i) {
    raw.x.push_back(double(st.episode_ends[i]));
    raw.y.push_back(st.returns[i]);
    avg.x.push_back(double(st.episode_ends[i]));
    avg.y.push_back(mean_last(std::vector<double>(st.returns.begin(), st.returns.begin() + std::ptrdiff_t(i + 1)), 10));
    lo = std::min(lo, st.returns[i]);
    hi = std::max(hi, st.returns[i]);
  }
  if (lo > hi) lo = -1, hi = 0;
  samples::plot_detail::panel(os, 90, 70, 860, 250, 0, double(std::max<std::int64_t>(st.step, 1)), lo - 0.05 * (hi - lo),
                              hi + 0.05 * (hi - lo), {raw, avg}, "return per training episode", "environment step",
                              false);
  PlotSeries un{"unconstrained plan", "#7f7f7f", {}, {}, true}, bu{"plan under the budget", "#2ca02c", {}, {}};
  auto a = samples::device_bytes_per_position(unconstrained), b = samples::device_bytes_per_position(budgeted);
  double top = std::max(budget, measured);
  for (std::size_t i = 0; i < a.size(); ++i) {
    un.x.push_back(100.0 * double(i) / double(std::max<std::size_t>(a.size() - 1, 1)));
    un.y.push_back(a[i]);
    top = std::max(top, a[i]);
  }
  for (std::size_t i = 0; i < b.size(); ++i) {
    bu.x.push_back(100.0 * double(i) / double(std::max<std::size_t>(b.size() - 1, 1)));
    bu.y.push_back(b[i]);
    top = std::max(top, b[i]);
  }
  std::vector<PlotSeries> series{un, bu};
  if (budget > 0) series.push_back({"critic step's budget", "#d62728", {0, 100}, {budget, budget}, true});
  samples::plot_detail::panel(os, 90, 430, 860, 250, 0, 100, 0, top * 1.08, series,
                              "device memory over one critic update", "progress through the step (% of its ops)", true);
  os << "</svg>\n";
  return os.str();
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  samples::Cli cli("ddpg",
                   "DDPG on Pendulum or a 2-link reacher, with replay poisoning and a clustering defence, "
                   "within a device memory budget.");
  o.common.declare(cli, "");
  cli.option("--env", o.env, "pendulum (default) or reacher");
  cli.option("--hidden", o.hidden, "units in each of the two hidden layers (default 128)");
  cli.option("--batch", o.batch, "transitions per update (default 128)");
  cli.option("--warmup", o.warmup, "random-action steps before the first update (default 1000)");
  cli.option("--noise", o.noise, "exploration: Gaussian noise on the actions in [-1, 1] (default 0.1)");
  cli.option("--actor-lr", o.actor_lr, "actor's Adam learning rate (default 1e-3)");
  cli.option("--critic-lr", o.critic_lr, "critic's Adam learning rate (default 1e-3)");
  cli.option("--gamma", o.gamma, "discount (default 0.99)");
  cli.option("--tau", o.tau, "soft target update rate (default 0.005)");
  cli.option("--buffer", o.buffer, "replay capacity (default: every step of the run)");
  cli.option("--attack", o.attack, "share of transitions the adversary poisons (default 0)");
  cli.option("--attack-kind", o.attack_kind, "flip (rewards), perturb (states) or both (either, at random; default)");
  cli.option("--attack-sigma", o.sigma, "state perturbation, in units of each observation's scale (default 0.5)");
  cli.flag("--defence", o.defence, "cluster the replay pool and filter risky transitions before sampling");
  cli.option("--defence-every", o.defence_every, "environment steps between rescorings of the pool (default 250)");
  cli.option("--clusters", o.clusters, "k-means clusters of the defence (default 32)");
  cli.option("--threshold", o.threshold, "robust z-score above which the defence filters (default 4)");
  cli.option("--eval-episodes", o.eval_episodes, "noise-free evaluation episodes at the end (default 10)");
  cli.option("--stop-after", o.stop_after, "stop after this many steps of this run, as if interrupted");
  cli.parse(argc, argv);
  o.common.check(cli);
  std::unique_ptr<Env> env = make_env(o.env), eval_env = make_env(o.env);
  if (!env) cli.usage_error("--env takes pendulum or reacher, not '" + o.env + "'");
  if (o.hidden <= 0 || o.batch <= 0 || o.warmup < 0 || o.eval_episodes < 0 || o.buffer < 0 || o.stop_after < 0)
    cli.usage_error("--hidden and --batch must be positive; --warmup, --eval-episodes, --buffer, --stop-after not negative");
  if (!(o.attack >= 0 && o.attack <= 1)) cli.usage_error("--attack is a share in [0, 1]");
  if (o.attack_kind != "flip" && o.attack_kind != "perturb" && o.attack_kind != "both")
    cli.usage_error("--attack-kind takes flip, perturb or both");
  if (o.defence_every <= 0 || o.clusters <= 0 || !(o.threshold > 0))
    cli.usage_error("--defence-every, --clusters and --threshold must be positive");
  const samples::CommonArgs& a = o.common;
  std::FILE* out = a.json ? stderr : stdout;
  const std::uint64_t seed = std::uint64_t(a.seed);
  const std::int64_t total = a.steps > 0 ? a.steps : (o.env == "pendulum" ? 20000 : 30000);
  const std::int64_t capacity = o.buffer > 0 ? o.buffer : std::max<std::int64_t>(total, 1);

  // Networks, optimizers and the four steps.
  nn::manual_seed(seed);
  Hyper h;
  h.obs = env->obs_dim();
  h.act = env->act_dim();
  h.hidden = int(o.hidden);
  h.batch = o.batch;
  h.gamma = o.gamma;
  h.tau = o.tau;
  h.actor_lr = o.actor_lr;
  h.critic_lr = o.critic_lr;
  Agent agent(h.obs, h.act, h.hidden);
  CompileOptions copts{.backend = a.device, .threads = int(a.threads)};
  Learner learner(agent, h, copts);
  const StepSizes sizes = learner.plan_sizes();
  // --budget covers the four steps together (a percentage is of their
  // unconstrained total). Each inference step gets its proportional share,
  // or the least it can run in if that is more (0: unconstrained, if its
  // whole need fits); the two training steps share the rest in proportion
  // to their needs.
  StepBudgets budgets;
  std::size_t budget_total = 0;
  if (!a.budget.empty()) {
    budget_total = parse_bytes(a.budget, sizes.total());
    auto share = [&](std::size_t need) { return std::size_t(double(budget_total) * double(need) / double(sizes.total())); };
    const StepSizes least = learner.plan_least();
    std::size_t act = std::max(share(sizes.act), least.act), score = std::max(share(sizes.score), least.score);
    budgets.act.device = act < sizes.act ? act : 0;
    budgets.score.device = score < sizes.score ? score : 0;
    act = std::min(act, sizes.act);
    score = std::min(score, sizes.score);
    if (act + score >= budget_total)
      fail<BudgetError>("--budget ", format_bytes(budget_total), " cannot hold even the two inference steps (at least ",
                        format_bytes(least.act + least.score), ")");
    const std::size_t rest = budget_total - act - score;
    budgets.critic.device = std::size_t(double(rest) * double(sizes.critic) / double(sizes.critic + sizes.actor));
    budgets.actor.device = rest - budgets.critic.device;
  }
  for (Budget* b : {&budgets.critic, &budgets.actor, &budgets.act, &budgets.score}) {
    b->host = a.host.empty() ? 0 : parse_bytes(a.host);
    b->nvme_dir = a.nvme_dir;
  }
  try {
    learner.compile(budgets);
  } catch (const BudgetError& e) {
    fail<BudgetError>("--budget ", format_bytes(budget_total), " is too small: its shares for the critic, actor, "
                      "acting and scoring steps are ", format_bytes(budgets.critic.device), ", ",
                      format_bytes(budgets.actor.device), ", ", format_bytes(budgets.act.device), " and ",
                      format_bytes(budgets.score.device), " (unconstrained they take ", format_bytes(sizes.critic), ", ",
                      format_bytes(sizes.actor), ", ", format_bytes(sizes.act), " and ", format_bytes(sizes.score),
                      "): ", e.what());
  }
  const Plan unconstrained_critic = learner.unconstrained_critic_plan();

  ReplayBuffer buf(capacity, h.obs, h.act);
  Attack attack{o.attack, o.attack_kind, o.sigma};
  Defence defence({int(o.clusters), o.threshold, o.defence_every});

  char config[512];
  std::snprintf(config, sizeof config,
                "env=%s hidden=%lld batch=%lld warmup=%lld noise=%g actor_lr=%g critic_lr=%g gamma=%g tau=%g "
                "buffer=%lld attack=%g kind=%s sigma=%g defence=%d every=%lld clusters=%lld threshold=%g steps=%lld "
                "seed=%lld",
                o.env.c_str(), (long long)o.hidden, (long long)o.batch, (long long)o.warmup, o.noise, o.actor_lr,
                o.critic_lr, o.gamma, o.tau, (long long)capacity, o.attack, o.attack_kind.c_str(), o.sigma,
                int(o.defence), (long long)o.defence_every, (long long)o.clusters, o.threshold, (long long)total,
                (long long)a.seed);
  std::fprintf(out, "ddpg: %s, %lld environment steps, actor and critic %lld-%lld, batch %lld%s%s\n", o.env.c_str(),
               (long long)total, (long long)o.hidden, (long long)o.hidden, (long long)o.batch,
               o.attack > 0 ? (", " + std::to_string(int(std::lround(100 * o.attack))) + "% of transitions poisoned (" +
                               o.attack_kind + ")")
                                  .c_str()
                            : "",
               o.defence ? ", defence on" : "");
  std::fprintf(out, "critic step:\n%s", learner.critic_step().summary().c_str());
  if (budget_total)
    std::fprintf(out, "device budget %s: critic step %s (unconstrained %s), actor step %s (%s), acting %s, scoring %s\n",
                 format_bytes(budget_total).c_str(), format_bytes(learner.critic_step().plan().total_bytes()).c_str(),
                 format_bytes(sizes.critic).c_str(), format_bytes(learner.actor_step().plan().total_bytes()).c_str(),
                 format_bytes(sizes.actor).c_str(), format_bytes(learner.act_step().plan().total_bytes()).c_str(),
                 format_bytes(learner.score_step().plan().total_bytes()).c_str());

  // The first update follows environment step first_update_after (1-based).
  const std::int64_t first_update_after = std::max<std::int64_t>(o.warmup, 1);
  RunState st;
  st.obs.resize(std::size_t(h.obs));
  env->reset(seed, 0);
  env->observe(st.obs.data());

  // --resume: the networks and the critic's optimizer through io's
  // checkpoint, the rest (the actor's optimizer, the buffer, the
  // environment, the counters) among its extra tensors.
  std::int64_t resumed_from = 0;
  if (!a.resume.empty()) {
    io::TrainingState ts = io::load_checkpoint(a.resume, agent, learner.critic_opt());
    auto md = ts.metadata.find("config");
    if (ts.metadata["sample"] != "ddpg" || md == ts.metadata.end() || md->second != config)
      fail<DataError>(a.resume, ": saved with the configuration\n  ",
                      md == ts.metadata.end() ? "(none)" : md->second, "\nbut this run has\n  ", config,
                      "\nresume with the same options");
    auto get = [&](const std::string& name) -> const Tensor& {
      for (auto& [n, t] : ts.extra)
        if (n == name) return t;
      fail<DataError>(a.resume, ": no '", name, "' in the checkpoint");
    };
    for (auto& s : learner.actor_opt().state()) {
      const Tensor& t = get("actor_opt." + std::to_string(s.param) + "." + s.slot);
      if (t.nbytes() != s.tensor.nbytes()) fail<DataError>(a.resume, ": actor optimizer state of another shape");
      std::memcpy(s.tensor.raw(), t.raw(), t.nbytes());
    }
    buf.load(ts.extra, a.resume);
    const Tensor& c = get("counters");
    if (c.numel() != 10) fail<DataError>(a.resume, ": 'counters' has ", c.numel(), " numbers, not 10");
    const std::int64_t* cv = c.data<std::int64_t>();
    st.step = ts.step;
    st.episode = cv[0];
    st.rounds = cv[1];
    learner.critic_opt().set_steps(cv[2]);
    learner.actor_opt().set_steps(cv[3]);
    st.last = {cv[4], cv[5], cv[6], cv[7]};
    st.poisoned = cv[8];
    const Tensor& es = get("env_state");
    env->set_state(std::vector<double>(es.data<double>(), es.data<double>() + es.numel()));
    const Tensor& ob = get("obs");
    if (ob.numel() != h.obs) fail<DataError>(a.resume, ": 'obs' of another environment");
    std::copy(ob.data<float>(), ob.data<float>() + h.obs, st.obs.begin());
    st.ep_return = get("ep_return").data<double>()[0];
    const Tensor& rt = get("returns");
    st.returns.assign(rt.data<double>(), rt.data<double>() + rt.numel());
    const Tensor& ee = get("episode_ends");
    st.episode_ends.assign(ee.data<std::int64_t>(), ee.data<std::int64_t>() + ee.numel());
    const Tensor& cl = get("critic_loss");
    st.critic_loss.assign(cl.data<float>(), cl.data<float>() + cl.numel());
    if (st.returns.size() != st.episode_ends.size() || std::int64_t(st.returns.size()) != st.episode ||
        st.step > total)
      fail<DataError>(a.resume, ": its episode history does not match its counters (or it is past --steps)");
    const std::int64_t updates = std::max<std::int64_t>(0, st.step - first_update_after + 1);
    if (std::int64_t(st.critic_loss.size()) != updates)
      fail<DataError>(a.resume, ": its loss history (", st.critic_loss.size(), " updates) does not match step ",
                      st.step);
    for (Step* s : learner.steps()) s->set_steps_run(updates);
    learner.all_changed();
    resumed_from = st.step;
    std::fprintf(out, "resumed from %s at step %lld\n", a.resume.c_str(), (long long)st.step);
  }

  auto save = [&](std::int64_t step) {
    if (a.checkpoint.empty()) return;
    io::NamedTensors extra = buf.tensors();
    for (auto& s : learner.actor_opt().state())
      extra.emplace_back("actor_opt." + std::to_string(s.param) + "." + s.slot, s.tensor);
    extra.emplace_back("counters", i64_tensor({st.episode, st.rounds, learner.critic_opt().steps(),
                                               learner.actor_opt().steps(), st.last.scored, st.last.filtered,
                                               st.last.poisoned, st.last.poisoned_filtered, st.poisoned, 0}));
    extra.emplace_back("env_state", f64_tensor(env->state()));
    Tensor ob({h.obs}, DType::f32);
    std::copy(st.obs.begin(), st.obs.end(), ob.data<float>());
    extra.emplace_back("obs", ob);
    extra.emplace_back("ep_return", f64_tensor({st.ep_return}));
    extra.emplace_back("returns", f64_tensor(st.returns));
    extra.emplace_back("episode_ends", i64_tensor(st.episode_ends));
    Tensor cl({std::int64_t(st.critic_loss.size())}, DType::f32);
    std::copy(st.critic_loss.begin(), st.critic_loss.end(), cl.data<float>());
    extra.emplace_back("critic_loss", cl);
    io::save_checkpoint(a.checkpoint, agent, learner.critic_opt(), step, {{"sample", "ddpg"}, {"config", config}},
                        extra);
  };

  // The loop: one environment step, then (after the warm-up) one update.
  std::vector<float> act(static_cast<std::size_t>(h.act)), s(std::size_t(h.obs)), s2(std::size_t(h.obs));
  std::vector<double> update_ms;
  const std::int64_t last = o.stop_after > 0 ? std::min(total, st.step + o.stop_after) : total;
  const std::int64_t log_every = a.log_every > 0 ? a.log_every : std::max<std::int64_t>(1, total / 20);
  auto t_start = std::chrono::steady_clock::now();
  for (; st.step < last; ++st.step) {
    const std::int64_t t = st.step;
    if (t < o.warmup) {
      Rng rng(seed, kWarmupAction + std::uint64_t(t));
      for (float& x : act) x = float(rng.uniform(-1, 1));
    } else {
      learner.act(st.obs.data(), act.data());
      Rng rng(seed, kExplore + std::uint64_t(t));
      for (float& x : act) x = float(clip(double(x) + o.noise * rng.normal(), -1, 1));
    }
    const StepResult res = env->step(act.data());
    s = st.obs;
    env->observe(s2.data());
    st.ep_return += res.reward;
    float r = float(res.reward);
    const bool poisoned = attack.apply(seed, std::uint64_t(t), *env, s.data(), r, s2.data());
    st.poisoned += poisoned;
    env->observe(st.obs.data());
    buf.add(s.data(), act.data(), r, s2.data(), res.terminal, poisoned, !o.defence);
    if (res.terminal || res.truncated) {
      st.returns.push_back(st.ep_return);
      st.episode_ends.push_back(t + 1);
      ++st.episode;
      st.ep_return = 0;
      env->reset(seed, std::uint64_t(st.episode));
      env->observe(st.obs.data());
    }
    if (t + 1 >= first_update_after) {
      const std::int64_t update = t + 1 - first_update_after;  // updates done before this one
      if (o.defence && update % o.defence_every == 0)
        st.last = defence.rescore(buf, update > 0 ? &learner : nullptr, seed, std::uint64_t(st.rounds++));
      if (buf.sample(seed, std::uint64_t(update), learner.s().data<float>(), learner.a().data<float>(),
                     learner.r().data<float>(), learner.s2().data<float>(), learner.not_done().data<float>(),
                     h.batch)) {
        auto t0 = std::chrono::steady_clock::now();
        const float loss = learner.update();
        update_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        if (!std::isfinite(loss)) fail("the critic's loss is ", loss, " at step ", t + 1, ": training diverged");
        st.critic_loss.push_back(loss);
      } else {
        st.critic_loss.push_back(std::nanf(""));
      }
    }
    if ((t + 1) % log_every == 0 || t + 1 == last) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      std::fprintf(out, "step %7lld/%lld  episodes %4lld  return (last 10) %9.1f  critic loss %8.4f  %6.0f steps/s",
                   (long long)(t + 1), (long long)total, (long long)st.episode, mean_last(st.returns, 10),
                   st.critic_loss.empty() ? 0.0 : double(st.critic_loss.back()),
                   double(t + 1 - resumed_from) / std::max(secs, 1e-9));
      if (o.defence && st.last.scored)
        std::fprintf(out, "  filtered %lld/%lld (%lld of %lld poisoned)", (long long)st.last.filtered,
                     (long long)st.last.scored, (long long)st.last.poisoned_filtered, (long long)st.last.poisoned);
      std::fprintf(out, "\n");
      std::fflush(out);
    }
    if (a.save_every > 0 && (t + 1) % a.save_every == 0 && t + 1 < last) save(t + 1);
  }
  save(st.step);

  // Noise-free evaluation against random actions, on the same episodes.
  const double eval_return = evaluate(*eval_env, &learner, seed, o.eval_episodes);
  const double random_return = evaluate(*eval_env, nullptr, seed, o.eval_episodes);
  std::size_t peak = 0;
  std::int64_t recomputed = 0, swapped = 0;
  for (Step* sp : learner.steps()) {
    peak += sp->measured_device_bytes();
    recomputed += std::int64_t(sp->plan().count(plan::Choice::recompute));
    swapped += std::int64_t(sp->plan().count(plan::Choice::host));
  }
  std::vector<double> ms = update_ms;
  std::sort(ms.begin(), ms.end());
  const double median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  const double last10 = mean_last(st.returns, 10);
  const double recall = st.last.poisoned ? double(st.last.poisoned_filtered) / double(st.last.poisoned) : std::nan("");
  const double precision = st.last.filtered ? double(st.last.poisoned_filtered) / double(st.last.filtered) : std::nan("");
  std::fprintf(out,
               "%lld episodes; mean return of the last 10: %.1f; evaluation (%lld noise-free episodes) %.1f against "
               "%.1f for random actions; median update %.2f ms\n",
               (long long)st.episode, last10, (long long)o.eval_episodes, eval_return, random_return, median_ms);
  if (o.defence && st.last.scored)
    std::fprintf(out,
                 "defence, last rescoring: %lld of %lld transitions filtered; %lld of the %lld poisoned ones (recall "
                 "%.2f, precision %.2f)\n",
                 (long long)st.last.filtered, (long long)st.last.scored, (long long)st.last.poisoned_filtered,
                 (long long)st.last.poisoned, recall, precision);
  if (!a.plot.empty())
    samples::write_text_file(a.plot, svg_of_run("ddpg on " + o.env + (o.attack > 0 ? ", poisoned" : "") +
                                                     (o.defence ? ", defended" : ""),
                                                 st, learner.critic_step().plan(), unconstrained_critic,
                                                 double(budgets.critic.device),
                                                 double(learner.critic_step().measured_device_bytes())));
  if (a.json) {
    std::string returns = "[", ends = "[";
    for (std::size_t i = 0; i < st.returns.size(); ++i) {
      char b[40];
      std::snprintf(b, sizeof b, "%s%.3f", i ? "," : "", st.returns[i]);
      returns += b;
      ends += (i ? "," : "") + std::to_string(st.episode_ends[i]);
    }
    samples::JsonLine j;
    j.add("sample", "ddpg")
        .add("env", o.env)
        .add("data", o.env)
        .add("metric", "return")
        .add("steps", st.step)
        .add("episodes", st.episode)
        .add("return_last10", last10)
        .add("eval_return", eval_return)
        .add("random_return", random_return)
        .add("random_minus_eval_return", random_return - eval_return)  // below 0: the policy beats random actions
        .add("final_loss", st.critic_loss.empty() ? std::nan("") : double(st.critic_loss.back()))
        .add("attack", o.attack)
        .add("attack_kind", o.attack_kind)
        .add("defence", o.defence)
        .add("poisoned", st.poisoned)
        .add("scored", st.last.scored)
        .add("filtered", st.last.filtered)
        .add("poisoned_in_pool", st.last.poisoned)
        .add("poisoned_filtered", st.last.poisoned_filtered)
        .add("step_ms_median", median_ms)
        .add("peak_device_bytes", peak)
        .add("budget_bytes", budget_total)
        .add("unconstrained_bytes", sizes.total())
        .add("recomputed", recomputed)
        .add("swapped_to_host", swapped)
        .add("resumed_from", resumed_from)
        .add("seed", a.seed)
        .add("threads", a.threads)
        .add("hidden", o.hidden)
        .add("batch", o.batch)
        .add("parameters", agent.actor.num_parameters() + agent.critic.num_parameters())
        .raw("returns", returns + "]")
        .raw("episode_ends", ends + "]");
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "ddpg: %s\n", e.what());
  return 1;
}
