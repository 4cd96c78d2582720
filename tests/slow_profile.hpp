#pragma once
// A device profile that claims ops and copies are a thousand times slower
// than on any machine these tests run on: a step's predicted time then
// misses its measured time by far more than the 20% that makes it re-plan
// on measured times (plan::prediction_is_off).
#include <frugal/frugal.hpp>

namespace test_profiles {

inline frugal::DeviceProfile thousandfold_slow() {
  frugal::DeviceProfile slow = frugal::DeviceProfile::defaults("cpu", 2);
  slow.gemm_flops /= 1000;
  slow.stream_bytes /= 1000;
  slow.op_latency_s *= 1000;
  slow.copy_bytes /= 1000;
  slow.copy_latency_s *= 1000;
  return slow;
}

}  // namespace test_profiles
