#pragma once
// The IDX format of MNIST and Fashion-MNIST: a big-endian header, then bytes.
// Files may be gzip-compressed (Debian's dataset-fashion-mnist ships .gz):
// with zlib (FRUGAL_HAVE_ZLIB, set by the CMake package when zlib is found)
// both forms are read, without it only uncompressed files.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#ifdef FRUGAL_HAVE_ZLIB
#include <zlib.h>
#endif

#include "../core/error.hpp"
#include "../core/tensor.hpp"

namespace frugal::data {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;
};

namespace idx_detail {
// Reads bytes from a plain or gzip file; `read` returns how many it got.
class ByteSource {
 public:
  explicit ByteSource(const std::filesystem::path& path) : path_(path) {
#ifdef FRUGAL_HAVE_ZLIB
    gz_ = gzopen(path.c_str(), "rb");  // also reads uncompressed files as they are
    if (!gz_) fail<DataError>("cannot open IDX file ", path.string());
    gzbuffer(gz_, 1 << 17);
#else
    f_.open(path, std::ios::binary);
    if (!f_) fail<DataError>("cannot open IDX file ", path.string());
#endif
  }
  ~ByteSource() {
#ifdef FRUGAL_HAVE_ZLIB
    if (gz_) gzclose(gz_);
#endif
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  std::size_t read(void* dst, std::size_t n) {
#ifdef FRUGAL_HAVE_ZLIB
    std::size_t got = 0;
    while (got < n) {
      unsigned chunk = unsigned(std::min<std::size_t>(n - got, 1u << 30));
      int r = gzread(gz_, static_cast<char*>(dst) + got, chunk);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(gz_, &code);
        fail<DataError>(path_.string(), ": corrupt compressed data (", msg ? msg : "zlib error", ")");
      }
      if (r == 0) break;
      got += std::size_t(r);
    }
    return got;
#else
    f_.read(static_cast<char*>(dst), std::streamsize(n));
    return std::size_t(f_.gcount());
#endif
  }

 private:
  std::filesystem::path path_;
#ifdef FRUGAL_HAVE_ZLIB
  gzFile gz_ = nullptr;
#else
  std::ifstream f_;
#endif
};
}  // namespace idx_detail

// Reads an IDX file of unsigned bytes (type code 0x08), plain or gzip.
inline IdxArray read_idx(const std::filesystem::path& path) {
  idx_detail::ByteSource f(path);
  unsigned char head[4];
  if (f.read(head, 4) != 4) fail<DataError>(path.string(), ": too short to be an IDX file");
  if (head[0] == 0x1f && head[1] == 0x8b)
    fail<DataError>(path.string(), ": a gzip file, and this build has no zlib: decompress it with gunzip, or "
                    "install zlib1g-dev and reconfigure");
  if (head[0] != 0 || head[1] != 0) fail<DataError>(path.string(), ": not an IDX file (bad magic)");
  if (head[2] != 0x08) fail<DataError>(path.string(), ": IDX element type ", int(head[2]), " is not unsigned byte");
  int rank = head[3];
  if (rank < 1 || rank > 4) fail<DataError>(path.string(), ": IDX rank ", rank, " is out of range");
  IdxArray a;
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    if (f.read(b, 4) != 4) fail<DataError>(path.string(), ": truncated IDX header");
    std::int64_t d = (std::int64_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    a.dims.push_back(d);
    n *= d;
  }
  a.bytes.resize(std::size_t(n));
  if (f.read(a.bytes.data(), std::size_t(n)) != std::size_t(n))
    fail<DataError>(path.string(), ": truncated: the header promises ", n, " bytes of data but the file has fewer");
  unsigned char extra;
  if (f.read(&extra, 1) != 0)
    fail<DataError>(path.string(), ": more data than the header's dimensions promise (", n, " bytes)");
  return a;
}

// Images as f32 in [0, 1], shape [N, rows*cols]; labels as i32, shape [N].
struct ImageSet {
  Tensor images;
  Tensor labels;
  std::int64_t size() const { return labels.numel(); }
};

inline ImageSet load_idx_images(const std::filesystem::path& images, const std::filesystem::path& labels) {
  IdxArray im = read_idx(images), lb = read_idx(labels);
  if (im.dims.size() != 3) fail<DataError>(images.string(), ": expected a 3-D image array");
  if (lb.dims.size() != 1 || lb.dims[0] != im.dims[0])
    fail<DataError>(labels.string(), ": ", lb.dims.empty() ? 0 : lb.dims[0], " labels for ", im.dims[0], " images in ",
                    images.string());
  std::int64_t n = im.dims[0], px = im.dims[1] * im.dims[2];
  ImageSet s{Tensor({n, px}, DType::f32), Tensor({n}, DType::i32)};
  float* x = s.images.data<float>();
  for (std::size_t i = 0; i < im.bytes.size(); ++i) x[i] = float(im.bytes[i]) / 255.0f;
  std::int32_t* y = s.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) y[i] = lb.bytes[std::size_t(i)];
  return s;
}

// The first of `base` and `base`.gz that exists (empty if neither).
inline std::filesystem::path idx_file(const std::filesystem::path& dir, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"})
    if (std::filesystem::exists(dir / name)) return dir / name;
  return {};
}

// MNIST-layout training and test sets (train-images-idx3-ubyte, ..., t10k-...),
// plain or gzip: Fashion-MNIST as Debian's dataset-fashion-mnist installs it
// under /usr/share/datasets/fashion-mnist. Throws a DataError naming the
// directory and the missing file.
struct TrainTestImages {
  ImageSet train, test;
};
inline TrainTestImages load_idx_train_test(const std::filesystem::path& dir) {
  const char* names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                          "t10k-labels-idx1-ubyte"};
  std::filesystem::path p[4];
  for (int i = 0; i < 4; ++i) {
    p[i] = idx_file(dir, names[i]);
    if (p[i].empty()) fail<DataError>(dir.string(), ": no ", names[i], " (or ", names[i], ".gz) there");
  }
  return {load_idx_images(p[0], p[1]), load_idx_images(p[2], p[3])};
}

}  // namespace frugal::data
