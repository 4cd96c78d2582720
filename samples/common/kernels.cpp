// The CPU kernels, compiled once for all the sample programs (and the interop
// test): every other file of theirs defines FRUGAL_KERNELS_ELSEWHERE.
#include <frugal/frugal.hpp>
