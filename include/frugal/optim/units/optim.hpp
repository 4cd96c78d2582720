#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// the optimizers' vtables and members. Each class's declared destructor is
// its key function.
#include "../adamw.hpp"
#include "../loss_scaler.hpp"
#include "../sgd.hpp"
#include "../cosine_annealing_lr.hpp"
#include "../linear_lr.hpp"
#include "../one_cycle_lr.hpp"
#include "../step_lr.hpp"

namespace frugal::optim {

AdamW::~AdamW() = default;
LossScaler::~LossScaler() = default;
SGD::~SGD() = default;
LinearLR::~LinearLR() = default;
CosineAnnealingLR::~CosineAnnealingLR() = default;
StepLR::~StepLR() = default;
OneCycleLR::~OneCycleLR() = default;

}  // namespace frugal::optim
