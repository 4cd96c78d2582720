#pragma once
// The IDX format of MNIST and Fashion-MNIST: a big-endian header, then bytes.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "../core/error.hpp"
#include "../core/tensor.hpp"

namespace frugal::data {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;
};

// Reads an uncompressed IDX file of unsigned bytes (type code 0x08).
inline IdxArray read_idx(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail<DataError>("cannot open IDX file ", path.string());
  unsigned char head[4];
  if (!f.read(reinterpret_cast<char*>(head), 4))
    fail<DataError>(path.string(), ": too short to be an IDX file");
  if (head[0] != 0 || head[1] != 0)
    fail<DataError>(path.string(), ": not an IDX file (bad magic; a .gz file must be decompressed first)");
  if (head[2] != 0x08) fail<DataError>(path.string(), ": IDX element type ", int(head[2]), " is not unsigned byte");
  int rank = head[3];
  if (rank < 1 || rank > 4) fail<DataError>(path.string(), ": IDX rank ", rank, " is out of range");
  IdxArray a;
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) fail<DataError>(path.string(), ": truncated IDX header");
    std::int64_t d = (std::int64_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    a.dims.push_back(d);
    n *= d;
  }
  a.bytes.resize(std::size_t(n));
  if (!f.read(reinterpret_cast<char*>(a.bytes.data()), std::streamsize(n)))
    fail<DataError>(path.string(), ": truncated: the header promises ", n, " bytes of data but the file has fewer");
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

}  // namespace frugal::data
