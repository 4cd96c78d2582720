#pragma once
// Where a calibrated DeviceProfile is kept between runs, and how it is read
// and written: one small JSON file per backend and thread count, replaced
// atomically (temp file, fsync, rename) so a crash never leaves half a file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "../plan/device_profile.hpp"

namespace frugal {

// The CPU model and how many logical CPUs it has: a profile cached on one
// machine is not reused on another (a shared home directory, a copied cache).
inline std::string machine_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model;
  int cpus = 0;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string value = line.substr(std::min(line.size(), colon + 2));
    if (key == "processor") ++cpus;
    if (model.empty() && (key == "model name" || key == "Model" || key == "Hardware" || key == "cpu model"))
      model = value;
  }
  if (model.empty()) model = "unknown CPU";
  if (cpus == 0) cpus = int(std::thread::hardware_concurrency());
  return cat(model, ", ", cpus, " logical CPUs");
}

// $FRUGAL_CACHE_DIR, else $XDG_CACHE_HOME/frugal, else $HOME/.cache/frugal;
// nullopt when none is set.
inline std::optional<std::filesystem::path> profile_cache_dir() {
  auto env = [](const char* k) -> const char* {
    const char* v = std::getenv(k);
    return v && *v ? v : nullptr;
  };
  if (const char* d = env("FRUGAL_CACHE_DIR")) return std::filesystem::path(d);
  if (const char* d = env("XDG_CACHE_HOME")) return std::filesystem::path(d) / "frugal";
  if (const char* d = env("HOME")) return std::filesystem::path(d) / ".cache" / "frugal";
  return std::nullopt;
}

inline std::string profile_cache_file_name(const std::string& backend, int threads) {
  return cat("profile-", backend, "-t", threads, ".json");
}

// Throws DataError naming the file when it cannot be read or is not a
// complete profile.
inline DeviceProfile read_profile_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail<DataError>(file.string(), ": cannot read the device profile: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail<DataError>(file.string(), ": reading the device profile failed: ", std::strerror(errno));
  std::string s = text.str();
  if (s.size() > (1 << 20)) fail<DataError>(file.string(), ": ", s.size(), " bytes is too large for a device profile");
  return DeviceProfile::from_json(s, file.string());
}

// Writes p to `file` through a temp file in the same directory, synced
// before the rename: a reader sees the old file or the new one, never a
// mixture. Throws IoError naming the file and the system's reason.
inline void write_profile_atomically(const DeviceProfile& p, const std::filesystem::path& file) {
  std::filesystem::path dir = file.parent_path().empty() ? std::filesystem::path(".") : file.parent_path();
  std::string tmp = (dir / ("." + file.filename().string() + ".XXXXXX")).string();
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0)
    fail<IoError>("cannot write the device profile cache in '", dir.string(), "': ", std::strerror(errno));
  auto give_up = [&](const char* what) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail<IoError>("cannot write the device profile cache '", file.string(), "': ", what, ": ", std::strerror(err));
  };
  std::string text = p.to_json();
  for (std::size_t done = 0; done < text.size();) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) give_up("write");
    done += std::size_t(w);
  }
  ::fchmod(fd, 0644);
  if (::fsync(fd) != 0) give_up("fsync");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail<IoError>("cannot write the device profile cache '", file.string(), "': close: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail<IoError>("cannot write the device profile cache '", file.string(), "': rename: ", std::strerror(err));
  }
  // The rename itself survives a crash once the directory is synced.
  if (int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
}

}  // namespace frugal
