#pragma once
// The umbrella header: the whole public vocabulary and the CPU backend.
#include "core/bytes.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/shape.hpp"
#include "core/tensor.hpp"
#include "graph/capture.hpp"
#include "ops/all.hpp"
#include "plan/budget_solve.hpp"
#include "plan/estimate.hpp"
#include "plan/plan.hpp"
#include "plan/report.hpp"
#include "plan/verify.hpp"
#include "runtime/compile.hpp"
#include "runtime/process_memory.hpp"
// The CPU kernels are compiled (and register themselves) in every file that
// includes this header, unless FRUGAL_KERNELS_ELSEWHERE is defined there: a
// program of many files can define it in all but one of them and compile the
// kernels once.
#ifndef FRUGAL_KERNELS_ELSEWHERE
#include "backend/cpu/cpu_backend.hpp"
#endif
#include "nn/activation.hpp"
#include "nn/linear.hpp"
#include "nn/sequential.hpp"
#include "nn/dropout.hpp"
#include "nn/layer_norm.hpp"
#include "nn/embedding.hpp"
#include "nn/attention.hpp"
#include "nn/transformer.hpp"
#include "nn/gpt.hpp"
#include "nn/conv.hpp"
#include "nn/batch_norm.hpp"
#include "nn/pool.hpp"
#include "nn/resnet.hpp"
#include "optim/adamw.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/sgd.hpp"
#include "data/idx.hpp"
#include "nn/graph_conv.hpp"
#include "data/graph.hpp"
