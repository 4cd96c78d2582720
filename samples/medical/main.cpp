// medical: lesion classification with a visual-attention multiscale CNN and
// a Mahalanobis-distance loss, within a device memory budget; reports test
// accuracy, macro-F1 and per-class recall, and draws the attention maps.
//
//   medical --epochs 8                          # attention CNN + Mahalanobis loss
//   medical --loss ce                           # the same backbone, cross-entropy
//   medical --model resnet20                    # ResNet-20, cross-entropy
//   medical --budget 60% --attention-png att.png
//
// The data. Debian packages no labelled medical image set (apt-cache search
// finds viewers, converters and python3-dipy, whose data sets download at
// run time), so the sample generates one, seeded: grey-level "scans" of
// --image pixels square, each with one lesion of four classes
//   0 cyst          smooth ellipse, sharp margin, homogeneous interior
//   1 spiculated    irregular outline with 5-9 thin spicules, heterogeneous
//   2 lobulated     2-4 broad lobes, ill-defined (blurred) margin
//   3 rim-enhancing a bright or dark rim around a core of the opposite sign
// on textured tissue: three octaves of value noise, faint fibre-like
// stripes, a linear bias field (as MRI coils give), a random base intensity.
// Each lesion has a random position, size (12-22% of the image), elongation,
// orientation and contrast (±0.10-0.30 against a texture of 0.08-0.18, so
// some lesions are faint, and brighter or darker than tissue in every
// class); the image is blurred by a 3x3 point-spread function and gets Rician
// noise (the magnitude of a complex Gaussian, σ 0.02-0.07), as MRI
// magnitude images do. The classes are balanced (image i has class i mod 4).
// Image i of a split is drawn from its own stream, Rng(seed, split * 2^32 + i),
// so the splits (--train, --val, --test images) never share an image and do
// not change when another split's size does. --data-seed (default 2201)
// fixes the data; --seed the initialisation and the batch order, so runs
// over several seeds see the same images.
//
// The models. `--model attention` (default): three scales of 3x3 conv +
// batch norm + ReLU stages (width w, 2w, 4w at full, 1/2 and 1/4 size); at
// each scale a spatial attention module (nn::SpatialAttentionPool: a 1x1
// convolution scores every position, a softmax over positions weights them)
// pools the features to a vector; the three vectors are concatenated (the
// fusion), projected to a --embed-dimensional embedding and layer-normalised
// (no affine: it fixes the embedding's scale, which a learned covariance
// could otherwise trade against). Then `--loss mahalanobis` (default):
// nn::MahalanobisHead, learned class centres and a learned shared
// covariance through a Cholesky factor (ops/mahalanobis.hpp), predicting
// the nearest centre; or `--loss ce`: a linear classifier on the same
// embedding with cross-entropy. `--model resnet20`: nn::resnet20_cifar with
// cross-entropy. All three train with AdamW, linear warm-up then cosine
// decay, random crops and flips.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <frugal/frugal.hpp>
#ifdef FRUGAL_HAVE_ZLIB
#include <zlib.h>
#endif

#include "../common/session.hpp"

using namespace frugal;

namespace {

constexpr std::int64_t kClasses = 4;
const char* const kClassNames[kClasses] = {"cyst", "spiculated", "lobulated", "rim-enhancing"};

struct Options {
  samples::CommonArgs common;
  std::string model = "attention", loss = "mahalanobis", attention_png;
  std::int64_t image = 32, train = 2400, val = 400, test = 800, data_seed = 2201;
  std::int64_t batch = 64, eval_batch = 100, warmup = 50, width = 16, embed = 32, stop_after = 0;
  double lr = 2e-3, weight_decay = 5e-4, likelihood_weight = 0.1, margin = 0.1;
  bool no_augment = false;
};

// ---- the synthetic lesion data set ------------------------------------------

// Value noise: a random grid of cells+1 squared values, smoothly interpolated.
void add_value_noise(std::vector<double>& img, std::int64_t S, int cells, double amp, Rng& rng) {
  std::vector<double> grid(std::size_t((cells + 1) * (cells + 1)));
  for (double& g : grid) g = rng.uniform(-1, 1);
  for (std::int64_t y = 0; y < S; ++y)
    for (std::int64_t x = 0; x < S; ++x) {
      const double gx = double(x) / double(S) * cells, gy = double(y) / double(S) * cells;
      const int ix = int(gx), iy = int(gy);
      double fx = gx - ix, fy = gy - iy;
      fx = fx * fx * (3 - 2 * fx), fy = fy * fy * (3 - 2 * fy);
      auto at = [&](int i, int j) { return grid[std::size_t(j * (cells + 1) + i)]; };
      const double top = at(ix, iy) * (1 - fx) + at(ix + 1, iy) * fx;
      const double bottom = at(ix, iy + 1) * (1 - fx) + at(ix + 1, iy + 1) * fx;
      img[std::size_t(y * S + x)] += amp * (top * (1 - fy) + bottom * fy);
    }
}

// One image of class c, S x S, values in [0, 1].
void draw_lesion_image(float* out, std::int64_t S, int c, Rng& rng) {
  const double s = double(S), pi = 3.141592653589793;
  std::vector<double> tissue(std::size_t(S * S), 0.0), texture(std::size_t(S * S), 0.0);
  // Tissue: base intensity, three octaves of texture, fibres, bias field.
  const double base = rng.uniform(0.35, 0.55), tex = rng.uniform(0.08, 0.18);
  add_value_noise(tissue, S, 3, tex, rng);
  add_value_noise(tissue, S, 6, tex * 0.6, rng);
  add_value_noise(tissue, S, 12, tex * 0.35, rng);
  const double fib_angle = rng.uniform(0, pi), fib_freq = rng.uniform(0.25, 0.6), fib_amp = rng.uniform(0, 0.04);
  const double bias_x = rng.uniform(-0.1, 0.1), bias_y = rng.uniform(-0.1, 0.1);
  // The lesion's own texture (used by the heterogeneous classes).
  add_value_noise(texture, S, 8, 1.0, rng);
  // Geometry.
  const double cx = s / 2 + rng.uniform(-0.2, 0.2) * s, cy = s / 2 + rng.uniform(-0.2, 0.2) * s;
  const double r0 = rng.uniform(0.12, 0.22) * s, elong = rng.uniform(1.0, 1.4), orient = rng.uniform(0, pi);
  const double contrast = (rng.uniform() < 0.5 ? -1 : 1) * rng.uniform(0.10, 0.30);
  double margin = 0.6, hetero = 0.0;
  std::array<double, 4> amp{}, phase{};
  std::array<int, 4> freq{};
  int spicules = 0;
  std::array<double, 9> sp_angle{}, sp_len{};
  switch (c) {
    case 0: margin = rng.uniform(0.4, 0.8), hetero = 0.02; break;
    case 1:
      margin = rng.uniform(0.5, 0.9), hetero = rng.uniform(0.25, 0.45);
      for (int k = 0; k < 3; ++k) freq[k] = 5 + int(rng.below(5)), amp[k] = rng.uniform(0.03, 0.08), phase[k] = rng.uniform(0, 2 * pi);
      spicules = 5 + int(rng.below(5));
      for (int k = 0; k < spicules; ++k) sp_angle[k] = rng.uniform(0, 2 * pi), sp_len[k] = rng.uniform(0.4, 0.9) * r0;
      break;
    case 2:
      margin = rng.uniform(1.4, 2.4), hetero = rng.uniform(0.05, 0.15);
      for (int k = 0; k < 3; ++k) freq[k] = 2 + k, amp[k] = rng.uniform(0.08, 0.2), phase[k] = rng.uniform(0, 2 * pi);
      break;
    default: margin = rng.uniform(0.5, 0.9), hetero = 0.05; break;
  }
  const double rim = rng.uniform(0.25, 0.4);  // class 3: the rim's share of the radius
  std::vector<double> img(std::size_t(S * S));
  for (std::int64_t y = 0; y < S; ++y)
    for (std::int64_t x = 0; x < S; ++x) {
      const std::size_t i = std::size_t(y * S + x);
      const double bg = base + tissue[i] + fib_amp * std::sin(fib_freq * (x * std::cos(fib_angle) + y * std::sin(fib_angle))) +
                        bias_x * (double(x) / s - 0.5) + bias_y * (double(y) / s - 0.5);
      // Position in the lesion's frame: rotated, the long axis stretched.
      const double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
      const double u = (dx * std::cos(orient) + dy * std::sin(orient)) / elong;
      const double v = -dx * std::sin(orient) + dy * std::cos(orient);
      const double rho = std::hypot(u, v), theta = std::atan2(v, u);
      double r = r0;
      for (int k = 0; k < 3; ++k) r += r0 * amp[k] * std::cos(freq[k] * theta + phase[k]);
      for (int k = 0; k < spicules; ++k) {
        double d = std::remainder(theta - sp_angle[k], 2 * pi);
        const double w = 0.12 + 0.5 / std::max(rho, 1.0);  // a spicule stays about a pixel wide
        if (std::abs(d) < w) r += sp_len[k] * (1 - std::abs(d) / w) * (1 - std::abs(d) / w);
      }
      const double inside = 1 / (1 + std::exp(-(r - rho) / margin));
      double value = contrast * (1 + hetero * texture[i] / 0.5);
      if (c == 3) {  // the rim enhances; the core has the opposite sign, weaker
        const double core = 1 / (1 + std::exp(-((1 - rim) * r - rho) / 0.7));
        value = contrast * (1 - core) - 0.6 * contrast * core;
      }
      img[i] = bg + inside * value;
    }
  // Point-spread blur (separable [1 2 1] / 4, edges clamped), then Rician noise.
  std::vector<double> tmp(img.size());
  auto clampi = [&](std::int64_t k) { return std::clamp<std::int64_t>(k, 0, S - 1); };
  for (std::int64_t y = 0; y < S; ++y)
    for (std::int64_t x = 0; x < S; ++x)
      tmp[std::size_t(y * S + x)] = 0.25 * img[std::size_t(y * S + clampi(x - 1))] + 0.5 * img[std::size_t(y * S + x)] +
                                    0.25 * img[std::size_t(y * S + clampi(x + 1))];
  for (std::int64_t y = 0; y < S; ++y)
    for (std::int64_t x = 0; x < S; ++x)
      img[std::size_t(y * S + x)] = 0.25 * tmp[std::size_t(clampi(y - 1) * S + x)] + 0.5 * tmp[std::size_t(y * S + x)] +
                                    0.25 * tmp[std::size_t(clampi(y + 1) * S + x)];
  const double sigma = rng.uniform(0.02, 0.07);
  for (std::size_t i = 0; i < img.size(); ++i) {
    const double re = img[i] + sigma * rng.normal(), im = sigma * rng.normal();
    out[i] = float(std::clamp(std::hypot(re, im), 0.0, 1.0));
  }
}

data::ImageSet lesion_images(std::uint64_t data_seed, std::uint64_t split, std::int64_t n, std::int64_t S) {
  data::ImageSet set{Tensor({n, S * S}), Tensor({n}, DType::i32)};
  for (std::int64_t i = 0; i < n; ++i) {
    Rng rng(data_seed, (split << 32) + std::uint64_t(i));
    const int c = int(i % kClasses);
    set.labels.data<std::int32_t>()[i] = c;
    draw_lesion_image(set.images.data<float>() + i * S * S, S, c, rng);
  }
  return set;
}

// ---- the models ---------------------------------------------------------------

struct ConvBnRelu : nn::Module {
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
  ConvBnRelu(std::int64_t in, std::int64_t out) : conv(in, out, 3, {.padding = 1, .bias = false}), bn(out) {
    register_module("conv", conv);
    register_module("bn", bn);
  }
  Var operator()(Var x) { return relu(bn(conv(x))); }
};

// What a model gives for a batch: class scores [N, K] (logits, or −½ d² for
// the Mahalanobis head: its softmax is the discriminant's posterior), the
// training loss, and the attention maps at the three scales (attention model).
struct Forward {
  Var scores, loss;
  std::vector<Var> attention;
};

class MultiscaleAttentionNet : public nn::Module {
 public:
  MultiscaleAttentionNet(std::int64_t w, std::int64_t embed, bool mahalanobis, MahalanobisLossOptions lo)
      : stem_(1, w), s1_(w, w), s2a_(w, 2 * w), s2b_(2 * w, 2 * w), s3a_(2 * w, 4 * w), s3b_(4 * w, 4 * w),
        att1_(w), att2_(2 * w), att3_(4 * w), fuse_(7 * w, embed), mahalanobis_(mahalanobis),
        head_(kClasses, embed, {.loss = lo}), classifier_(embed, kClasses) {
    register_module("stem", stem_);
    register_module("stage1", s1_);
    register_module("stage2a", s2a_);
    register_module("stage2b", s2b_);
    register_module("stage3a", s3a_);
    register_module("stage3b", s3b_);
    register_module("attention1", att1_);
    register_module("attention2", att2_);
    register_module("attention3", att3_);
    register_module("fuse", fuse_);
    if (mahalanobis) register_module("head", head_);
    else register_module("classifier", classifier_);
  }
  Forward forward(Var x, std::optional<Var> labels) {
    Var f1 = s1_(stem_(x));
    Var f2 = s2b_(s2a_(max_pool2d(f1, 2)));
    Var f3 = s3b_(s3a_(max_pool2d(f2, 2)));
    auto [p1, a1] = att1_.pool(f1);
    auto [p2, a2] = att2_.pool(f2);
    auto [p3, a3] = att3_.pool(f3);
    Var z = layer_norm(fuse_(concat({p1, p2, p3}, 1)));
    Forward out;
    out.attention = {a1, a2, a3};
    if (mahalanobis_) {
      if (labels) out.loss = head_.loss(z, *labels);
      else out.scores = head_.distances(z) * -0.5;
    } else {
      Var logits = classifier_(z);
      if (labels) out.loss = cross_entropy(logits, *labels);
      else out.scores = logits;
    }
    return out;
  }
  const nn::MahalanobisHead& head() const { return head_; }

 private:
  ConvBnRelu stem_, s1_, s2a_, s2b_, s3a_, s3b_;
  nn::SpatialAttentionPool att1_, att2_, att3_;
  nn::Linear fuse_;
  bool mahalanobis_;
  nn::MahalanobisHead head_;
  nn::Linear classifier_;
};

class ResNetModel : public nn::Module {
 public:
  ResNetModel() : net_(nn::resnet20_cifar(kClasses, 1)) { register_module("net", *net_); }
  Forward forward(Var x, std::optional<Var> labels) {
    Forward out;
    Var logits = net_->forward(x);
    if (labels) out.loss = cross_entropy(logits, *labels);
    else out.scores = logits;
    return out;
  }

 private:
  std::unique_ptr<nn::Layer> net_;
};

// ---- metrics and the attention grid -------------------------------------------

struct Scores {
  double accuracy = 0, macro_f1 = 0, loss = 0;
  std::array<double, kClasses> recall{};
};
Scores score(const std::vector<std::array<std::int64_t, kClasses>>& confusion, double loss) {
  Scores s;
  s.loss = loss;
  std::int64_t total = 0, correct = 0;
  for (int t = 0; t < kClasses; ++t)
    for (int p = 0; p < kClasses; ++p) total += confusion[std::size_t(t)][std::size_t(p)];
  for (int c = 0; c < kClasses; ++c) {
    std::int64_t tp = confusion[std::size_t(c)][std::size_t(c)], actual = 0, predicted = 0;
    for (int k = 0; k < kClasses; ++k) actual += confusion[std::size_t(c)][std::size_t(k)], predicted += confusion[std::size_t(k)][std::size_t(c)];
    correct += tp;
    s.recall[std::size_t(c)] = actual ? double(tp) / double(actual) : 0;
    const double precision = predicted ? double(tp) / double(predicted) : 0;
    const double r = s.recall[std::size_t(c)];
    s.macro_f1 += (precision + r > 0 ? 2 * precision * r / (precision + r) : 0) / kClasses;
  }
  s.accuracy = total ? double(correct) / double(total) : 0;
  return s;
}

std::uint32_t crc32_of(const unsigned char* p, std::size_t n, std::uint32_t crc = 0) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// An RGB PNG: zlib-compressed where frugal was built with zlib, else in
// stored (uncompressed) deflate blocks, which every reader accepts.
void write_png(const std::string& path, std::int64_t w, std::int64_t h, const std::vector<unsigned char>& rgb) {
  std::vector<unsigned char> raw;
  for (std::int64_t y = 0; y < h; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), rgb.begin() + y * w * 3, rgb.begin() + (y + 1) * w * 3);
  }
  std::vector<unsigned char> z;
#ifdef FRUGAL_HAVE_ZLIB
  uLongf zn = compressBound(uLong(raw.size()));
  z.resize(zn);
  if (compress2(z.data(), &zn, raw.data(), uLong(raw.size()), 9) != Z_OK) fail<IoError>("cannot compress ", path);
  z.resize(zn);
#else
  z = {0x78, 0x01};
  for (std::size_t at = 0; at < raw.size() || at == 0;) {
    const std::size_t len = std::min<std::size_t>(65535, raw.size() - at);
    z.push_back(at + len == raw.size() ? 1 : 0);
    z.push_back(len & 0xff), z.push_back(len >> 8), z.push_back(~len & 0xff), z.push_back((~len >> 8) & 0xff);
    z.insert(z.end(), raw.begin() + std::ptrdiff_t(at), raw.begin() + std::ptrdiff_t(at + len));
    at += len;
    if (len == 0) break;
  }
  std::uint32_t a = 1, b = 0;
  for (unsigned char c : raw) a = (a + c) % 65521, b = (b + a) % 65521;
  const std::uint32_t adler = (b << 16) | a;
  for (int k = 3; k >= 0; --k) z.push_back((adler >> (8 * k)) & 0xff);
#endif
  std::string out = "\x89PNG\r\n\x1a\n";
  auto chunk = [&](const char* type, const std::vector<unsigned char>& data) {
    std::vector<unsigned char> body(type, type + 4);
    body.insert(body.end(), data.begin(), data.end());
    auto be32 = [&](std::uint32_t v) {
      for (int k = 3; k >= 0; --k) out.push_back(char((v >> (8 * k)) & 0xff));
    };
    be32(std::uint32_t(data.size()));
    out.append(body.begin(), body.end());
    be32(crc32_of(body.data(), body.size()));
  };
  std::vector<unsigned char> ihdr;
  for (std::uint32_t v : {std::uint32_t(w), std::uint32_t(h)})
    for (int k = 3; k >= 0; --k) ihdr.push_back((v >> (8 * k)) & 0xff);
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB
  chunk("IHDR", ihdr);
  chunk("IDAT", z);
  chunk("IEND", {});
  samples::write_text_file(path, out);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  samples::Cli cli("medical", "Classifies synthetic lesion images with a multiscale attention CNN and a Mahalanobis "
                              "loss within a device memory budget.");
  o.common.declare(cli, "(generated)");
  cli.option("--model", o.model, "attention (default: the multiscale attention CNN) or resnet20");
  cli.option("--loss", o.loss, "mahalanobis (default) or ce (cross-entropy); resnet20 trains with ce");
  cli.option("--image", o.image, "image side in pixels (default 32; a multiple of 4)");
  cli.option("--train", o.train, "training images (default 2400)");
  cli.option("--val", o.val, "validation images (default 400)");
  cli.option("--test", o.test, "test images (default 800)");
  cli.option("--data-seed", o.data_seed, "seed of the generated data set (default 2201)");
  cli.option("--batch", o.batch, "images per step (default 64)");
  cli.option("--eval-batch", o.eval_batch, "images per evaluation step (default 100)");
  cli.option("--lr", o.lr, "peak learning rate (AdamW, warm-up then cosine decay; default 2e-3)");
  cli.option("--weight-decay", o.weight_decay, "AdamW weight decay (default 5e-4)");
  cli.option("--warmup", o.warmup, "warm-up steps (default 50)");
  cli.option("--width", o.width, "channels of the attention CNN's first scale (default 16; then 2x and 4x)");
  cli.option("--embed", o.embed, "embedding dimension of the attention CNN (default 32)");
  cli.option("--likelihood-weight", o.likelihood_weight, "Mahalanobis loss: weight of the Gaussian likelihood term (default 0.1)");
  cli.option("--margin", o.margin, "Mahalanobis loss: margin alpha on the own class's distance (default 0.1)");
  cli.option("--attention-png", o.attention_png, "write the attention maps of 8 test images (2 per class) to this PNG");
  cli.flag("--no-augment", o.no_augment, "train without random crops and flips");
  cli.option("--stop-after", o.stop_after, "stop after this many steps of this run, as if interrupted");
  cli.parse(argc, argv);
  o.common.check(cli);
  if (o.model != "attention" && o.model != "resnet20") cli.usage_error("--model takes attention or resnet20");
  if (o.loss != "mahalanobis" && o.loss != "ce") cli.usage_error("--loss takes mahalanobis or ce");
  if (o.model == "resnet20") o.loss = "ce";  // the reference model: its own classifier, cross-entropy
  if (o.image < 8 || o.image % 4 || o.train < o.batch || o.val <= 0 || o.test <= 0 || o.batch <= 0 ||
      o.eval_batch <= 0 || o.warmup < 0 || o.width <= 0 || o.embed <= 0 || o.data_seed < 0)
    cli.usage_error("--image must be a multiple of 4 (at least 8); --train at least --batch; --val, --test, --batch, "
                    "--eval-batch, --width and --embed positive");
  const samples::CommonArgs& a = o.common;
  samples::Session session("medical", o.common);

  const std::int64_t S = o.image, px = S * S;
  data::ImageSet train = lesion_images(std::uint64_t(o.data_seed), 0, o.train, S);
  data::ImageSet val = lesion_images(std::uint64_t(o.data_seed), 1, o.val, S);
  data::ImageSet test = lesion_images(std::uint64_t(o.data_seed), 2, o.test, S);
  // Normalise with the training set's mean and standard deviation.
  double mean = 0, sq = 0;
  for (std::int64_t i = 0; i < train.images.numel(); ++i) mean += train.images.data<float>()[i];
  mean /= double(train.images.numel());
  for (std::int64_t i = 0; i < train.images.numel(); ++i) sq += std::pow(train.images.data<float>()[i] - mean, 2);
  const double stdev = std::sqrt(sq / double(train.images.numel()));
  std::vector<float> raw_test(test.images.data<float>(), test.images.data<float>() + test.images.numel());
  for (data::ImageSet* set : {&train, &val, &test})
    for (std::int64_t i = 0; i < set->images.numel(); ++i)
      set->images.data<float>()[i] = float((set->images.data<float>()[i] - mean) / stdev);

  nn::manual_seed(std::uint64_t(a.seed));
  const bool attention = o.model == "attention", mahalanobis = attention && o.loss == "mahalanobis";
  std::unique_ptr<MultiscaleAttentionNet> anet;
  std::unique_ptr<ResNetModel> rnet;
  nn::Module* model = nullptr;
  if (attention)
    model = (anet = std::make_unique<MultiscaleAttentionNet>(o.width, o.embed, mahalanobis,
                                                             MahalanobisLossOptions{o.likelihood_weight, o.margin}))
                .get();
  else model = (rnet = std::make_unique<ResNetModel>()).get();
  auto forward = [&](Var x, std::optional<Var> y) { return attention ? anet->forward(x, y) : rnet->forward(x, y); };

  optim::AdamW opt(model->parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  const std::int64_t B = o.batch, EB = std::min({o.eval_batch, o.val, o.test});
  CompileOptions copts{.backend = a.device, .threads = int(a.threads), .replan = !session.brokered_steps()};
  auto train_fn = [&](Var x, Var y) { return forward(x, y).loss; };
  auto eval_fn = [&](Var x) {
    Forward f = forward(x, std::nullopt);
    std::vector<Var> outs{f.scores};
    outs.insert(outs.end(), f.attention.begin(), f.attention.end());
    return outs;
  };
  std::vector<InputSpec> train_in{input<float>({B, 1, S, S}, "images"), input<std::int32_t>({B}, "labels")};
  std::vector<InputSpec> eval_in{input<float>({EB, 1, S, S}, "images")};

  PlannedStep free_train = plan_training(train_fn, train_in, opt, {}, copts);
  model->eval();
  PlannedStep free_eval = plan_inference(eval_fn, eval_in, {}, copts);
  model->train();
  // Under --budget one memory broker plans both steps within it, the
  // weights both keep on the device counted once (samples/common/session.hpp).
  samples::SampleSteps steps;
  session.compile_steps(steps, free_train, free_eval, train_fn, train_in, opt, copts, eval_fn, eval_in, copts);
  Step& step = *steps.train;
  Step& eval = *steps.eval;
  const std::size_t budget_total = steps.budget_total;

  data::EpochSampler sampler(train.size(), B, std::uint64_t(a.seed));
  const std::int64_t per_epoch = sampler.batches_per_epoch();
  const std::int64_t total = a.steps > 0 ? a.steps : (a.epochs > 0 ? a.epochs : 8) * per_epoch;
  const std::string label = o.model == "resnet20" ? "ResNet-20 + cross-entropy"
                            : mahalanobis         ? "multiscale attention CNN + Mahalanobis loss"
                                                  : "multiscale attention CNN + cross-entropy";
  char config[384];
  std::snprintf(config, sizeof config,
                "model=%s loss=%s image=%lld train=%lld data_seed=%lld batch=%lld lr=%g wd=%g width=%lld embed=%lld "
                "lambda=%g margin=%g augment=%d steps=%lld seed=%lld",
                o.model.c_str(), o.loss.c_str(), static_cast<long long>(S), static_cast<long long>(o.train),
                static_cast<long long>(o.data_seed), static_cast<long long>(B), o.lr, o.weight_decay,
                static_cast<long long>(o.width), static_cast<long long>(o.embed), o.likelihood_weight, o.margin,
                int(!o.no_augment), static_cast<long long>(total), static_cast<long long>(a.seed));
  std::fprintf(session.out(), "medical: %s on %lldx%lld synthetic lesions, %lld train / %lld validation / %lld test "
                              "images, %lld parameters, %lld steps (%.1f epochs)\n",
               label.c_str(), static_cast<long long>(S), static_cast<long long>(S), static_cast<long long>(o.train),
               static_cast<long long>(o.val), static_cast<long long>(o.test),
               static_cast<long long>(model->num_parameters()), static_cast<long long>(total),
               double(total) / double(per_epoch));
  session.print_plan(step, eval, budget_total, free_train.plan.total_bytes());
  const std::int64_t first = session.resume(*model, opt, {&step, &eval}, config);
  if (first > total) fail("the checkpoint is at step ", first, ", past --steps ", total);

  // Scores a set in whole evaluation batches: the confusion matrix and the
  // cross-entropy of the class scores.
  Tensor ex({EB, 1, S, S});
  auto evaluate = [&](const data::ImageSet& set) {
    std::vector<std::array<std::int64_t, kClasses>> confusion(kClasses);
    for (auto& row : confusion) row.fill(0);
    double loss = 0;
    std::int64_t seen = 0;
    for (std::int64_t f = 0; f + EB <= set.size(); f += EB) {
      std::memcpy(ex.raw(), set.images.data<float>() + f * px, std::size_t(EB * px) * sizeof(float));
      eval.run(ex);
      const float* sc = eval.output(0).data<float>();
      for (std::int64_t r = 0; r < EB; ++r) {
        const int t = set.labels.data<std::int32_t>()[f + r];
        const float* row = sc + r * kClasses;
        loss += samples::row_nll(row, kClasses, t);
        ++confusion[std::size_t(t)][std::size_t(std::max_element(row, row + kClasses) - row)];
        ++seen;
      }
    }
    return score(confusion, loss / double(std::max<std::int64_t>(seen, 1)));
  };
  auto lr_at = [&](std::int64_t s) {
    if (s < o.warmup) return o.lr * double(s + 1) / double(o.warmup);
    const double t = double(s - o.warmup) / std::max(1.0, double(total - o.warmup));
    return o.lr * 0.5 * (1 + std::cos(3.141592653589793 * t));
  };

  Tensor xb({B, 1, S, S}), yb({B}, DType::i32);
  session.start(first, total, "img", double(B), budget_total);
  std::int64_t s = first;
  const std::int64_t last = o.stop_after > 0 ? std::min(total, first + o.stop_after) : total;
  for (; s < last; ++s) {
    const std::int64_t* idx = sampler.batch(s);
    for (std::int64_t r = 0; r < B; ++r) {
      const float* src = train.images.data<float>() + idx[r] * px;
      float* dst = xb.data<float>() + r * px;
      if (o.no_augment) std::memcpy(dst, src, std::size_t(px) * sizeof(float));
      else data::random_crop_flip(dst, src, 1, S, S, 2, std::uint64_t(a.seed), std::uint64_t(s), std::uint64_t(r));
      yb.data<std::int32_t>()[r] = train.labels.data<std::int32_t>()[idx[r]];
    }
    opt.set_lr(lr_at(s));
    const auto t0 = std::chrono::steady_clock::now();
    const float loss = step.run(xb, yb);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    session.step_done(s, loss, ms, steps.measured_device_bytes(), *model, opt);
    if ((s + 1) % per_epoch == 0 && s + 1 < total) {
      const Scores v = evaluate(val);
      char line[160];
      std::snprintf(line, sizeof line, "epoch %lld: validation loss %.4f, accuracy %.2f%%, macro-F1 %.3f",
                    static_cast<long long>((s + 1) / per_epoch), v.loss, 100 * v.accuracy, v.macro_f1);
      session.validation(s + 1, v.loss, line);
    }
  }
  session.save(*model, opt, s);
  const Scores v = evaluate(val), t = evaluate(test);
  const std::int64_t n_test = o.test / EB * EB;

  // The attention grid: two test images per class, one row each (class
  // order); columns: the image, then it tinted by the attention at the full,
  // half and quarter scale (each map scaled to its own maximum); a green or
  // red bar on the left says whether the prediction was right.
  if (attention && !o.attention_png.empty()) {
    std::vector<std::int64_t> picks;
    for (int c = 0; c < kClasses; ++c)
      for (std::int64_t i = 0, found = 0; i < test.size() && found < 2; ++i)
        if (test.labels.data<std::int32_t>()[i] == c) picks.push_back(i), ++found;
    const std::int64_t rows = std::min<std::int64_t>(std::int64_t(picks.size()), EB);
    for (std::int64_t r = 0; r < EB; ++r)
      std::memcpy(ex.data<float>() + r * px, test.images.data<float>() + (r < rows ? picks[std::size_t(r)] : r) * px,
                  std::size_t(px) * sizeof(float));
    eval.run(ex);
    const std::int64_t zoom = std::max<std::int64_t>(1, 96 / S), cell = S * zoom, gap = 4, bar = 6;
    const std::int64_t W = bar + gap + 4 * (cell + gap), H = rows * (cell + gap) + gap;
    std::vector<unsigned char> rgb(std::size_t(W * H * 3), 255);
    auto put = [&](std::int64_t x, std::int64_t y, double r, double g, double b) {
      unsigned char* p = &rgb[std::size_t((y * W + x) * 3)];
      p[0] = (unsigned char)std::lround(255 * std::clamp(r, 0.0, 1.0));
      p[1] = (unsigned char)std::lround(255 * std::clamp(g, 0.0, 1.0));
      p[2] = (unsigned char)std::lround(255 * std::clamp(b, 0.0, 1.0));
    };
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = picks[std::size_t(r)], y0 = gap + r * (cell + gap);
      const float* sc = eval.output(0).data<float>() + r * kClasses;
      const bool right = std::max_element(sc, sc + kClasses) - sc == test.labels.data<std::int32_t>()[i];
      for (std::int64_t y = 0; y < cell; ++y)
        for (std::int64_t x = 0; x < bar; ++x) put(x, y0 + y, right ? 0.1 : 0.85, right ? 0.7 : 0.1, 0.1);
      for (int col = 0; col < 4; ++col) {
        const std::int64_t x0 = bar + gap + col * (cell + gap);
        const float* map = nullptr;
        std::int64_t ms = 0;
        float mx = 0;
        if (col > 0) {
          const Tensor& am = eval.output(col);
          ms = am.shape()[2];
          map = am.data<float>() + r * ms * ms;
          mx = *std::max_element(map, map + ms * ms);
        }
        for (std::int64_t y = 0; y < cell; ++y)
          for (std::int64_t x = 0; x < cell; ++x) {
            const double g = raw_test[std::size_t(i * px + (y / zoom) * S + x / zoom)];
            if (!map) {
              put(x0 + x, y0 + y, g, g, g);
              continue;
            }
            const double w = mx > 0 ? map[(y * ms / cell) * ms + x * ms / cell] / mx : 0;
            put(x0 + x, y0 + y, 0.55 * g + 0.45 * w, 0.55 * g + 0.1 * w, 0.55 * g + 0.45 * (1 - w) * 0.4);
          }
      }
    }
    write_png(o.attention_png, W, H, rgb);
    std::fprintf(session.out(), "attention maps of %lld test images written to %s\n", static_cast<long long>(rows),
                 o.attention_png.c_str());
  }

  const std::size_t peak = steps.measured_device_bytes();
  std::string recall = "[";
  for (int c = 0; c < kClasses; ++c) recall += (c ? "," : "") + std::to_string(t.recall[std::size_t(c)]);
  recall += "]";
  if (!a.json) {
    std::printf("test accuracy %.2f%%, macro-F1 %.3f on %lld images after %lld steps (validation accuracy %.2f%%)\n",
                100 * t.accuracy, t.macro_f1, static_cast<long long>(n_test), static_cast<long long>(s),
                100 * v.accuracy);
    for (int c = 0; c < kClasses; ++c) std::printf("  recall %-14s %.3f\n", kClassNames[c], t.recall[std::size_t(c)]);
    std::printf("median step %.1f ms; device peak %s%s\n", session.step_ms_median(), format_bytes(peak).c_str(),
                budget_total ? (" of a " + format_bytes(budget_total) + " budget").c_str() : "");
  }
  session.write_plot(label + " on synthetic lesions", step.plan(), free_train.plan, budget_total,
                     step.measured_device_bytes(), "validation loss", std::make_pair(s, v.loss));
  if (a.json) {
    samples::JsonLine j = session.summary_json(s, peak, budget_total, step, free_train.plan.total_bytes() + free_eval.plan.total_bytes());
    j.add("data", "synthetic-lesions")
        .add("model", o.model)
        .add("loss", o.loss)
        .add("metric", "accuracy")
        .add("accuracy", t.accuracy)
        .add("macro_f1", t.macro_f1)
        .raw("recall", recall)
        .add("test_loss", t.loss)
        .add("val_accuracy", v.accuracy)
        .add("val_macro_f1", v.macro_f1)
        .add("test_images", n_test)
        .add("image", S)
        .add("batch", B)
        .add("epochs", double(s) / double(per_epoch))
        .add("parameters", model->num_parameters());
    if (mahalanobis) {
      // The learned covariance stays positive definite by construction (its
      // precision's Cholesky factor has an exp diagonal); report its log-det.
      double logdet = 0;
      const std::vector<double> L = anet->head().cholesky();
      for (std::int64_t i = 0; i < o.embed; ++i) logdet -= 2 * std::log(L[std::size_t(i * o.embed + i)]);
      j.add("covariance_logdet", logdet);
    }
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
} catch (const frugal::Error& e) {
  std::fprintf(stderr, "medical: %s\n", e.what());
  return 1;
}
