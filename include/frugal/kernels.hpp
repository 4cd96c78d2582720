#pragma once
// frugal's kernels (and the planner, compiled once too), for a program that does not use CMake's
// frugal_add_kernels(target): include this header in exactly one source file
// of the program (a second one is a "multiple definition" link error, none
// an "undefined reference to frugal::make_backend"). Every other file
// includes <frugal/frugal.hpp>, which compiles no kernel.
//
// Compile that file with frugal's kernel flags, which frugal_add_kernels
// applies for you: -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off
// (none of them changes a computed bit; they let GCC vectorise). Flags that
// change results are refused here.
//
// Include it before any other frugal header in that file: the kernels it
// compiles are kept apart from copies other files compile
// (backend/cpu/abi.hpp).
#if defined(__FAST_MATH__)
#error "frugal's kernels must not be compiled with -ffast-math (or -Ofast): it changes their results. Compile the file that includes <frugal/kernels.hpp> without it, or use frugal_add_kernels(target) in CMake."
#endif
#define FRUGAL_KERNEL_UNIT 1
#include "backend/cpu/units/attention.hpp"
#include "backend/cpu/units/conv.hpp"
#include "backend/cpu/units/elementwise.hpp"
#include "backend/cpu/units/indexing.hpp"
#include "backend/cpu/units/matmul.hpp"
#include "backend/cpu/units/norm_pool.hpp"
#include "backend/cpu/units/optimizer.hpp"
#include "backend/cpu/units/reductions.hpp"
#include "backend/units/make_backend.hpp"
#include "graph/units/graph.hpp"
#include "nn/units/layers.hpp"
#include "ops/units/fused_elementwise.hpp"
#include "ops/units/ops.hpp"
#include "optim/units/optim.hpp"
#include "runtime/units/compile.hpp"
#include "runtime/units/step.hpp"
