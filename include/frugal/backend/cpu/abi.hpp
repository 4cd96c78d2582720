#pragma once
// Kernel code compiled in frugal's kernel units (which define
// FRUGAL_KERNEL_UNIT: frugal_add_kernels' sources and <frugal/kernels.hpp>)
// lives in another inline namespace than the same code compiled in any other
// file (a test or a benchmark that calls a kernel directly). The two copies
// then have different symbols, so the linker never keeps the other file's
// copy, compiled with its flags, for the kernel table: the kernels a step
// runs are always the ones compiled with frugal's own flags.
#if defined(FRUGAL_KERNEL_UNIT)
#define FRUGAL_KERNEL_ABI unit
#else
#define FRUGAL_KERNEL_ABI local
#endif
