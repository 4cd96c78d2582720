// io/: safetensors files (round trip, the exact layout, every corruption a
// clear error, atomic writes that never lose an earlier file) and training
// checkpoints (a resumed run continues bit for bit; mismatches are errors).
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <frugal/frugal.hpp>
#include <iterator>

#include "toy_task.hpp"
#include "bytes_of.hpp"

using namespace frugal;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp for one test, removed afterwards.
struct IoTempDir {
  fs::path dir;
  IoTempDir() {
    static int n = 0;
    dir = fs::temp_directory_path() / cat("io-test-", ::getpid(), "-", n++);
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~IoTempDir() {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }
  fs::path operator/(const std::string& name) const { return dir / name; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}
// A file from a header text and data bytes, laid out by hand.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// Tensors whose bytes are a known pattern, one per dtype, with a 0-d and an
// empty one among them.
io::NamedTensors every_dtype() {
  io::NamedTensors out;
  auto add = [&](std::string name, Shape s, DType t) {
    Tensor x(s, t);
    auto* b = static_cast<unsigned char*>(x.raw());
    for (std::size_t i = 0; i < x.nbytes(); ++i) b[i] = static_cast<unsigned char>(i * 37 + name.size());
    out.emplace_back(std::move(name), x);
  };
  add("w.f32", {2, 3}, DType::f32);
  add("a.scalar_f64", Shape{}, DType::f64);
  add("m.bf16", {3}, DType::bf16);
  add("b.f16", {2, 2}, DType::f16);
  add("empty_i32", {0, 5}, DType::i32);
  add("z.i64", {4}, DType::i64);
  add("bytes_u8", {7}, DType::u8);
  return out;
}

// Runs f and returns the DataError's message ("" and a failed check if it
// threw nothing or something else).
template <class F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a DataError, got: " << e.what());
  }
  FAIL("expected a DataError, nothing was thrown");
  return "";
}

}  // namespace

TEST_CASE("safetensors: every dtype, a 0-d and an empty tensor and the metadata round-trip", "[io]") {
  IoTempDir tmp;
  auto tensors = every_dtype();
  io::Metadata md{{"note", "quotes \" backslash \\ newline \n tab \t"}, {"unicode", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"}};
  fs::path p = tmp / "all.safetensors";
  io::write_safetensors(p, tensors, md);
  io::SafetensorsFile f = io::read_safetensors(p);
  CHECK(f.path == p);
  CHECK(f.metadata == md);
  REQUIRE(f.tensors.size() == tensors.size());
  for (auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(f.contains(name));
    CHECK(same_bytes(f.at(name), t));
  }
  CHECK(f.at("a.scalar_f64").shape().rank() == 0);
  CHECK(f.at("empty_i32").nbytes() == 0);
  // Data order is name order, so file order (by offset) is sorted too.
  for (std::size_t i = 1; i < f.tensors.size(); ++i) CHECK(f.tensors[i - 1].first < f.tensors[i].first);
  CHECK_FALSE(f.contains("nope"));
  CHECK_THAT(data_error([&] { f.at("nope"); }), Contains(p.string()) && Contains("'nope'"));
  // No metadata: no "__metadata__" key at all.
  io::write_safetensors(tmp / "plain.safetensors", tensors);
  CHECK(slurp(tmp / "plain.safetensors").find("__metadata__") == std::string::npos);
  CHECK(io::read_safetensors(tmp / "plain.safetensors").metadata.empty());
  // An empty file list is a valid (8 + 8 byte) file.
  io::write_safetensors(tmp / "none.safetensors", {});
  CHECK(io::read_safetensors(tmp / "none.safetensors").tensors.empty());
}

TEST_CASE("safetensors: the header is sorted, 8-byte aligned, space padded, and the bytes are deterministic", "[io]") {
  IoTempDir tmp;
  auto tensors = every_dtype();
  fs::path p = tmp / "a.safetensors";
  io::write_safetensors(p, tensors, {{"k", "v"}});
  std::string bytes = slurp(p);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  std::string header = bytes.substr(8, n);
  CHECK(header.front() == '{');
  std::size_t close = header.find_last_of('}');
  CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);  // only spaces after the object
  Json j = parse_json(header, "header");
  REQUIRE(j.members.size() == tensors.size() + 1);
  CHECK(j.members[0].first == "__metadata__");
  for (std::size_t i = 2; i < j.members.size(); ++i) CHECK(j.members[i - 1].first < j.members[i].first);
  // The exact text of one entry, as the reference writes it.
  CHECK_THAT(header, Contains("\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":["));
  CHECK_THAT(header, Contains("\"a.scalar_f64\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}"));
  // Data: contiguous in header order, ending at the end of the file.
  std::size_t total = 0;
  for (auto& [_, t] : tensors) total += t.nbytes();
  CHECK(bytes.size() == 8 + n + total);
  // Insertion order does not matter: the same set gives the same bytes.
  std::reverse(tensors.begin(), tensors.end());
  io::write_safetensors(tmp / "b.safetensors", tensors, {{"k", "v"}});
  CHECK(slurp(tmp / "b.safetensors") == bytes);
}

TEST_CASE("safetensors: writing rejects duplicate names, undefined tensors and the reserved name", "[io]") {
  IoTempDir tmp;
  fs::path p = tmp / "x.safetensors";
  Tensor t({2});
  CHECK_THROWS_WITH(io::write_safetensors(p, {{"a", t}, {"b", t}, {"a", t}}), Contains("'a'") && Contains(p.string()));
  CHECK_THROWS_WITH(io::write_safetensors(p, {{"u", Tensor()}}), Contains("'u'") && Contains("undefined"));
  CHECK_THROWS_WITH(io::write_safetensors(p, {{"__metadata__", t}}), Contains("reserves"));
  CHECK(tmp.names().empty());  // nothing was written, no temporary left
}

TEST_CASE("safetensors: a truncated file is a DataError naming the path at every length", "[io]") {
  IoTempDir tmp;
  fs::path good = tmp / "good.safetensors";
  io::write_safetensors(good, every_dtype(), {{"k", "v"}});
  std::string bytes = slurp(good);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  fs::path p = tmp / "cut.safetensors";
  for (std::size_t len : {std::size_t(0), std::size_t(4), std::size_t(7), std::size_t(8), std::size_t(9),
                          std::size_t(8 + n / 2), std::size_t(8 + n - 1), std::size_t(8 + n),
                          std::size_t(8 + n + 5), bytes.size() - 1}) {
    INFO("truncated to " << len << " of " << bytes.size() << " bytes");
    spit(p, bytes.substr(0, len));
    std::string m = data_error([&] { io::read_safetensors(p); });
    CHECK_THAT(m, Contains(p.string()));
    if (len < 8) CHECK_THAT(m, Contains("shorter than the 8-byte header length"));
    else if (len < 8 + n) CHECK_THAT(m, Contains("truncated or not a safetensors file"));
    else CHECK_THAT(m, Contains("truncated: the header promises") && Contains("bytes of data but the file has"));
  }
  CHECK_THAT(data_error([&] { io::read_safetensors(tmp / "missing.safetensors"); }),
             Contains("missing.safetensors") && Contains("cannot open") && Contains("No such file"));
  CHECK_THAT(data_error([&] { io::read_safetensors(tmp.dir); }), Contains("not a regular file"));
  // Trailing garbage after the data.
  spit(p, bytes + "xyz");
  CHECK_THAT(data_error([&] { io::read_safetensors(p); }), Contains(p.string()) && Contains("3 bytes of trailing garbage"));
}

TEST_CASE("safetensors: a flipped header byte is a DataError naming the path or a consistent file, never a crash",
          "[io]") {
  IoTempDir tmp;
  fs::path good = tmp / "good.safetensors";
  io::NamedTensors tensors{{"a", Tensor({3, 2})}, {"b", Tensor({5}, DType::i64)}};
  io::write_safetensors(good, tensors, {{"k", "v"}});
  std::string bytes = slurp(good);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  fs::path p = tmp / "flipped.safetensors";
  int errors = 0, readable = 0;
  for (std::size_t i = 0; i < 8 + n; ++i)
    for (unsigned char mask : {0x01, 0x20, 0x80}) {
      std::string b = bytes;
      b[i] = char(b[i] ^ mask);
      spit(p, b);
      try {
        io::SafetensorsFile f = io::read_safetensors(p);
        ++readable;  // e.g. a changed letter in a name or in the metadata: still a consistent file
        std::size_t sum = 0;
        for (auto& [_, t] : f.tensors) sum += t.nbytes();
        CHECK(sum == 24 + 40);
      } catch (const DataError& e) {
        ++errors;
        INFO("byte " << i << " ^ " << int(mask) << ": " << e.what());
        CHECK_THAT(e.what(), Contains(p.string()));
      }
    }
  CHECK(errors > 3 * int(n) / 2);  // most flips break the header
  CHECK(readable > 0);
}

TEST_CASE("safetensors: each kind of bad header gives its own clear DataError", "[io]") {
  IoTempDir tmp;
  fs::path p = tmp / "bad.safetensors";
  auto check = [&](const std::string& header, const std::string& data, const std::string& expect) {
    INFO("header " << header);
    spit(p, file_bytes(header, data));
    std::string m = data_error([&] { io::read_safetensors(p); });
    CHECK_THAT(m, Contains(p.string()) && Contains(expect));
  };
  const std::string d8(8, 'x'), d16(16, 'x');
  auto entry = [](const char* dtype, const char* shape, const char* offsets) {
    return cat("{\"dtype\":\"", dtype, "\",\"shape\":", shape, ",\"data_offsets\":", offsets, "}");
  };
  // Not JSON, with the byte (counted from the file's start: the header starts at byte 8).
  check("{\"a\":", "", "not valid JSON: at byte 13");
  check("{\"a\" 1}", "", "expected ':'");
  check("hello", "", "not valid JSON: at byte 8");
  check("{\"a\":\"unterminated}", "", "not closed");
  check("{\"a\":\"bad \\q escape\"}", "", "unknown escape");
  check("{\"a\":\"\\ud800 alone\"}", "", "surrogate");
  check("{\"a\":1.5}", "", "fractional");
  check("{\"a\":-1}", "", "negative");
  check("{\"a\":true}", "", "'true' is not allowed");
  check("{\"a\":null}", "", "'null' is not allowed");
  check("{\"a\":{}} x", "", "after the end of the JSON value");
  check("{\"a\":99999999999999999999999}", "", "too large");
  check(std::string(100, '[') + std::string(100, ']'), "", "nesting deeper");
  check("[]", "", "not an object");
  // Well-formed JSON that is not a valid safetensors header.
  check(cat("{\"a\":", entry("F8_E4M3", "[8]", "[0,8]"), "}"), d8, "unknown dtype 'F8_E4M3'");
  check(cat("{\"a\":", entry("F32", "[3]", "[0,8]"), "}"), d8, "shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8");
  check(cat("{\"a\":", entry("F32", "[2]", "[8,0]"), "}"), d8, "end before they begin");
  check(cat("{\"a\":", entry("F32", "[2]", "[0]"), "}"), d8, "two integers");
  check(cat("{\"a\":", entry("F32", "[\"2\"]", "[0,8]"), "}"), d8, "not an integer");
  check("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", d8, "missing 'data_offsets'");
  check(cat("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":[]}}"), d8, "unknown key 'extra'");
  check(cat("{\"a\":", entry("F32", "[2]", "[0,8]"), ",\"a\":", entry("F32", "[2]", "[8,16]"), "}"), d16,
        "duplicate key 'a'");
  check(cat("{\"a\":", entry("F32", "[2]", "[0,8]"), ",\"b\":", entry("F32", "[2]", "[4,12]"), "}"), d16, "overlap");
  check(cat("{\"a\":", entry("F32", "[2]", "[8,16]"), "}"), d16, "gap of 8 bytes before tensor 'a'");
  check(cat("{\"a\":", entry("F32", "[4]", "[0,16]"), "}"), d8,
        "truncated: the header promises 16 bytes of data but the file has 8");
  check(cat("{\"a\":", entry("F32", "[2]", "[0,8]"), "}"), d16, "8 bytes of trailing garbage");
  check(cat("{\"__metadata__\":{\"k\":3},\"a\":", entry("F32", "[2]", "[0,8]"), "}"), d8, "metadata entry 'k'");
  check(cat("{\"__metadata__\":[],\"a\":", entry("F32", "[2]", "[0,8]"), "}"), d8, "\"__metadata__\" is an array");
  // A header length past the end of the file.
  spit(p, file_bytes("{}", "").substr(0, 8));
  CHECK_THAT(data_error([&] { io::read_safetensors(p); }), Contains("header length 2 is larger than the file"));

  // And what the strict reader does accept: escapes, \u with a surrogate
  // pair, whitespace and a zero-size tensor sharing an offset.
  spit(p, file_bytes(cat(" {\"a\\u00e9\\ud83d\\ude00\\n\" : ", entry("F32", "[2]", "[0,8]"), " ,\n\"e\":",
                         entry("I64", "[0,3]", "[8,8]"), "}  "),
                     d8));
  io::SafetensorsFile f = io::read_safetensors(p);
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.tensors[0].first == "a\xc3\xa9\xf0\x9f\x98\x80\n");
  CHECK(f.tensors[1].second.shape() == Shape{0, 3});
}

TEST_CASE("safetensors: a failed write leaves the earlier file intact and no temporary behind", "[io]") {
  IoTempDir tmp;
  fs::path p = tmp / "model.safetensors";
  io::NamedTensors small{{"a", Tensor::from(std::vector<float>{1, 2, 3}, {3})}};
  io::write_safetensors(p, small, {{"version", "1"}});
  const std::string before = slurp(p);
  REQUIRE(tmp.names() == std::vector<std::string>{"model.safetensors"});

  SECTION("the disk fills up mid-write (a file size limit stands in for ENOSPC)") {
    // A write past RLIMIT_FSIZE fails with EFBIG, as one past a full disk
    // fails with ENOSPC: at the same point, through the same path.
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
    io::NamedTensors big{{"a", Tensor({64, 64})}};
    std::string m;
    try {
      io::write_safetensors(p, big, {{"version", "2"}});
    } catch (const IoError& e) {
      m = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK_THAT(m, Contains(p.string()) && Contains("cannot write") && Contains("File too large") &&
                      Contains("unchanged"));
  }
  SECTION("the target is a directory: the rename fails after the data is written") {
    fs::path d = tmp / "dir.safetensors";
    fs::create_directories(d / "inside");
    std::string m;
    try {
      io::write_safetensors(d, small);
    } catch (const IoError& e) {
      m = e.what();
    }
    CHECK_THAT(m, Contains(d.string()) && Contains("cannot rename") && Contains("directory"));
    CHECK(fs::is_directory(d / "inside"));
    fs::remove_all(d);
  }
  SECTION("the directory does not exist, or is a file") {
    CHECK_THROWS_MATCHES(io::write_safetensors(tmp / "no" / "such" / "dir.safetensors", small), IoError,
                         Catch::Matchers::Predicate<IoError>([&](const IoError& e) {
                           std::string m = e.what();
                           return m.find((tmp / "no").string()) != std::string::npos &&
                                  m.find("No such file or directory") != std::string::npos;
                         }));
    CHECK_THROWS_MATCHES(io::write_safetensors(p / "x.safetensors", small), IoError,
                         Catch::Matchers::Predicate<IoError>([&](const IoError& e) {
                           return std::string(e.what()).find("Not a directory") != std::string::npos;
                         }));
  }
  if (::geteuid() != 0) {  // root writes into read-only directories anyway
    SECTION("the directory is read-only") {
      fs::permissions(tmp.dir, fs::perms::owner_read | fs::perms::owner_exec);
      CHECK_THROWS_AS(io::write_safetensors(p, small, {{"version", "3"}}), IoError);
      fs::permissions(tmp.dir, fs::perms::owner_all);
    }
  }
  // Whatever failed, the earlier file is there, byte for byte, and alone.
  CHECK(slurp(p) == before);
  CHECK(io::read_safetensors(p).metadata.at("version") == "1");
  CHECK(tmp.names() == std::vector<std::string>{"model.safetensors"});
}

// ---------------------------------------------------------------- checkpoints

namespace {

// Linear + BatchNorm (parameters and buffers) + Linear.
struct IoNet : nn::Module {
  nn::Linear fc1, fc2;
  nn::BatchNorm2d bn;
  std::int64_t hidden;
  explicit IoNet(std::int64_t h = 12) : fc1(8, h), fc2(h, 4), bn(h / 4), hidden(h) {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  Var forward(Var x) {
    Var h = reshape(fc1(x), {x.dim(0), hidden / 4, 2, 2});
    return fc2(relu(reshape(bn(h), {x.dim(0), hidden})));
  }
};

constexpr std::int64_t kBatch = 16;

Step compile_net(IoNet& net, Optimizer& opt) {
  return compile([&](Var x, Var y) { return cross_entropy(net.forward(x), y); },
                 {input<float>({kBatch, 8}), input<std::int32_t>({kBatch})}, opt);
}

// Runs steps [from, to) on the batches of those step numbers.
std::vector<float> train(Step& step, int from, int to) {
  Tensor x({kBatch, 8}), y({kBatch}, DType::i32);
  std::vector<float> losses;
  for (int s = from; s < to; ++s) {
    toy::make_batch(x, y, std::uint64_t(s));
    losses.push_back(step.run(x, y));
  }
  return losses;
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}
// All of the model's tensors (parameters and buffers), as raw bytes.
std::string model_bytes(const nn::Module& m) {
  std::string out;
  for (auto& [_, t] : m.named_parameters()) out.append(static_cast<const char*>(t.raw()), t.nbytes());
  for (auto& [_, t] : m.named_buffers()) out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

template <class Opt, class Options>
void check_bitwise_resume(Options options, const char* kind) {
  IoTempDir tmp;
  constexpr int k = 3;
  // The uninterrupted run: k steps, a checkpoint, k more.
  nn::manual_seed(7);
  IoNet a;
  Opt opt_a(a.parameters(), options);
  Step step_a = compile_net(a, opt_a);
  std::vector<float> first = train(step_a, 0, k);
  Tensor history = Tensor::from(first, {k});
  io::save_checkpoint(tmp / "ckpt.safetensors", a, opt_a, step_a.steps_run(), {{"run", "a"}},
                      {{"loss_history", history}});
  std::vector<float> rest_a = train(step_a, k, 2 * k);
  io::save_checkpoint(tmp / "final-a.safetensors", a, opt_a, step_a.steps_run());

  // A new process, in effect: another seed, compiled, then the checkpoint.
  nn::manual_seed(99);
  IoNet b;
  Opt opt_b(b.parameters(), options);
  Step step_b = compile_net(b, opt_b);
  REQUIRE(model_bytes(a) != model_bytes(b));
  io::TrainingState st = io::load_checkpoint(tmp / "ckpt.safetensors", b, opt_b);
  CHECK(st.step == k);
  CHECK(st.metadata == io::Metadata{{"run", "a"}});
  REQUIRE(st.extra.size() == 1);
  CHECK(st.extra[0].first == "loss_history");
  CHECK(bits(st.extra[0].second.to_vector<float>()) == bits(first));
  CHECK(opt_b.steps() == k);
  step_b.set_steps_run(st.step);
  step_b.parameters_changed();
  std::vector<float> rest_b = train(step_b, k, 2 * k);
  io::save_checkpoint(tmp / "final-b.safetensors", b, opt_b, step_b.steps_run());

  INFO(kind);
  CHECK(rest_a.front() != rest_a.back());  // it did train
  CHECK(bits(rest_a) == bits(rest_b));
  CHECK(model_bytes(a) == model_bytes(b));
  // What CI's resume test compares: the final checkpoints, byte for byte.
  CHECK(slurp(tmp / "final-a.safetensors") == slurp(tmp / "final-b.safetensors"));

  // The file's names and metadata are the documented ones.
  io::SafetensorsFile f = io::read_safetensors(tmp / "ckpt.safetensors");
  CHECK(f.metadata.at("format") == "frugal-checkpoint-1");
  CHECK(f.metadata.at("step") == "3");
  CHECK(f.metadata.at("optimizer") == kind);
  CHECK(f.contains("fc1.weight"));
  CHECK(f.contains("bn.running_mean"));
  CHECK(f.contains("bn.num_batches_tracked"));
  CHECK(f.at("bn.num_batches_tracked").item<std::int64_t>() == k);
  CHECK(f.contains("extra.loss_history"));
  if (std::string(kind) == "adamw") {
    CHECK(f.contains("optimizer.fc1.weight.exp_avg"));
    CHECK(f.contains("optimizer.fc2.bias.exp_avg_sq"));
  } else {
    CHECK(f.contains("optimizer.bn.weight.momentum_buffer"));
  }
}

}  // namespace

TEST_CASE("checkpoint: AdamW training resumed from a checkpoint continues bit for bit", "[io][checkpoint]") {
  check_bitwise_resume<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2}, "adamw");
}

TEST_CASE("checkpoint: SGD with momentum resumed from a checkpoint continues bit for bit", "[io][checkpoint]") {
  check_bitwise_resume<optim::SGD>(optim::SGDOptions{.lr = 0.05, .momentum = 0.9}, "sgd");
}

TEST_CASE("checkpoint: optimizer state names, kinds and step counts", "[io][checkpoint]") {
  nn::manual_seed(1);
  IoNet net;
  optim::AdamW adamw(net.parameters(), {});
  optim::SGD sgd(net.parameters(), {});
  CHECK(adamw.kind() == "adamw");
  CHECK(sgd.kind() == "sgd");
  CHECK(adamw.state().empty());  // created when a step is compiled
  Step s = compile_net(net, adamw);
  auto st = adamw.state();
  REQUIRE(st.size() == 2 * net.parameters().size());
  CHECK(st[0].param == 0);
  CHECK(st[0].slot == "exp_avg");
  CHECK(st[1].slot == "exp_avg_sq");
  CHECK(st[0].tensor.raw() == adamw.exp_avg(0).raw());  // the live tensor, not a copy
  adamw.set_steps(41);
  CHECK(adamw.steps() == 41);
  train(s, 0, 1);
  CHECK(adamw.steps() == 42);
  CHECK_THROWS_WITH(sgd.set_steps(-1), Contains("negative"));

  // A parameter the module does not own is named by its index.
  IoTempDir tmp;
  Tensor stray = Tensor::from(std::vector<float>{1, 2}, {2});
  std::vector<Tensor> params = net.parameters();
  params.push_back(stray);
  optim::SGD sgd2(params, {.lr = 0.1, .momentum = 0.9});
  Step s2 = compile([&](Var x, Var y) {
    return cross_entropy(net.forward(x), y) + sum(persistent_var(stray, ValueKind::parameter, "stray"));
  }, {input<float>({kBatch, 8}), input<std::int32_t>({kBatch})}, sgd2);
  io::save_checkpoint(tmp / "c.safetensors", net, sgd2, 0);
  auto f = io::read_safetensors(tmp / "c.safetensors");
  CHECK(f.contains(cat("optimizer.", params.size() - 1, ".momentum_buffer")));
  CHECK(f.contains("optimizer.fc2.weight.momentum_buffer"));
  CHECK_THROWS_WITH(io::save_checkpoint(tmp / "d.safetensors", net, sgd2, 0, {{"step", "5"}}),
                    Contains("'step' is reserved"));
}

TEST_CASE("weights: save and load by state_dict names, strictly", "[io][checkpoint]") {
  IoTempDir tmp;
  nn::manual_seed(3);
  IoNet a;
  fs::path p = tmp / "w.safetensors";
  io::save_weights(p, a, {{"source", "test"}});
  io::SafetensorsFile f = io::read_safetensors(p);
  // Parameters then buffers, all present under PyTorch's names.
  for (const char* n : {"fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "fc2.weight", "fc2.bias",
                        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"})
    CHECK(f.contains(n));
  CHECK(f.tensors.size() == 9);

  nn::manual_seed(4);
  IoNet b;
  REQUIRE(model_bytes(a) != model_bytes(b));
  CHECK(io::load_weights(p, b).at("source") == "test");
  CHECK(model_bytes(a) == model_bytes(b));

  // A shape mismatch names the file, the tensor and both shapes; nothing is loaded.
  nn::manual_seed(5);
  IoNet wide(16);
  const std::string wide_before = model_bytes(wide);
  std::string m = data_error([&] { io::load_weights(p, wide); });
  CHECK_THAT(m, Contains(p.string()) && Contains("'fc1.weight'") && Contains("f32[12, 8]") && Contains("f32[16, 8]"));
  CHECK(model_bytes(wide) == wide_before);

  // A missing tensor; an unexpected one.
  io::NamedTensors without = f.tensors;
  std::erase_if(without, [](auto& nt) { return nt.first == "fc2.bias"; });
  io::write_safetensors(tmp / "missing.safetensors", without);
  CHECK_THAT(data_error([&] { io::load_weights(tmp / "missing.safetensors", b); }),
             Contains("missing.safetensors") && Contains("'fc2.bias'") && Contains("missing from the file"));
  io::NamedTensors more = f.tensors;
  more.emplace_back("fc3.weight", Tensor({2, 2}));
  io::write_safetensors(tmp / "more.safetensors", more);
  CHECK_THAT(data_error([&] { io::load_weights(tmp / "more.safetensors", b); }),
             Contains("more.safetensors") && Contains("'fc3.weight'") && Contains("does not"));
  // A dtype mismatch.
  io::NamedTensors as_f64 = f.tensors;
  for (auto& [n, t] : as_f64)
    if (n == "fc2.bias") t = Tensor({4}, DType::f64);
  io::write_safetensors(tmp / "f64.safetensors", as_f64);
  CHECK_THAT(data_error([&] { io::load_weights(tmp / "f64.safetensors", b); }),
             Contains("'fc2.bias'") && Contains("f64[4] in the file") && Contains("f32[4]"));

  // PyTorch exports without buffers: allowed on request, and the buffers keep their values.
  io::NamedTensors params_only = a.named_parameters();
  io::write_safetensors(tmp / "params.safetensors", params_only);
  CHECK_THAT(data_error([&] { io::load_weights(tmp / "params.safetensors", b); }), Contains("'bn.running_mean'"));
  b.bn.running_mean.data<float>()[0] = 42;
  io::load_weights(tmp / "params.safetensors", b, true);
  CHECK(b.bn.running_mean.data<float>()[0] == 42);
}

TEST_CASE("checkpoint: loading errors name the file and leave everything as it was", "[io][checkpoint]") {
  IoTempDir tmp;
  nn::manual_seed(8);
  IoNet a;
  optim::AdamW adamw(a.parameters(), {.lr = 1e-2});
  Step step = compile_net(a, adamw);
  train(step, 0, 2);
  fs::path ck = tmp / "ck.safetensors";
  io::save_checkpoint(ck, a, adamw, 2);

  nn::manual_seed(9);
  IoNet b;
  const std::string b_before = model_bytes(b);
  SECTION("before compile(): the optimizer has no state yet") {
    optim::AdamW fresh(b.parameters(), {});
    CHECK_THAT(data_error([&] { io::load_checkpoint(ck, b, fresh); }),
               Contains(ck.string()) && Contains("load the checkpoint after compile()"));
    CHECK(fresh.steps() == 0);
  }
  SECTION("another optimizer kind") {
    optim::SGD sgd(b.parameters(), {});
    Step s = compile_net(b, sgd);
    CHECK_THAT(data_error([&] { io::load_checkpoint(ck, b, sgd); }),
               Contains(ck.string()) && Contains("optimizer 'adamw'") && Contains("'sgd' optimizer"));
  }
  SECTION("a model of another shape") {
    nn::manual_seed(9);
    IoNet wide(16);
    optim::AdamW o(wide.parameters(), {});
    Step s = compile_net(wide, o);
    const std::string before = model_bytes(wide);
    CHECK_THAT(data_error([&] { io::load_checkpoint(ck, wide, o); }),
               Contains(ck.string()) && Contains("f32[12, 8]") && Contains("f32[16, 8]"));
    CHECK(model_bytes(wide) == before);
    CHECK(o.steps() == 0);
  }
  SECTION("weights alone are not a checkpoint") {
    optim::AdamW o(b.parameters(), {});
    Step s = compile_net(b, o);
    io::save_weights(tmp / "w.safetensors", a);
    CHECK_THAT(data_error([&] { io::load_checkpoint(tmp / "w.safetensors", b, o); }),
               Contains("w.safetensors") && Contains("not a frugal checkpoint") && Contains("load_weights"));
  }
  SECTION("an optimizer state tensor missing from the file") {
    optim::AdamW o(b.parameters(), {});
    Step s = compile_net(b, o);
    io::SafetensorsFile f = io::read_safetensors(ck);
    std::erase_if(f.tensors, [](auto& nt) { return nt.first == "optimizer.fc1.bias.exp_avg_sq"; });
    io::write_safetensors(tmp / "cut.safetensors", f.tensors, f.metadata);
    CHECK_THAT(data_error([&] { io::load_checkpoint(tmp / "cut.safetensors", b, o); }),
               Contains("'optimizer.fc1.bias.exp_avg_sq'") && Contains("missing from the file"));
    CHECK(o.steps() == 0);
  }
  CHECK(model_bytes(b) == b_before);
}
