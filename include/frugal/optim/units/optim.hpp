#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// the optimizers' vtables and members. Each class's declared destructor is
// its key function.
#include "../adamw.hpp"
#include "../loss_scaler.hpp"
#include "../sgd.hpp"

namespace frugal::optim {

AdamW::~AdamW() = default;
LossScaler::~LossScaler() = default;
SGD::~SGD() = default;

}  // namespace frugal::optim
