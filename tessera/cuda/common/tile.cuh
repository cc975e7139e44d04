// The parameters of a variant's tile both attention families read (Config, variant.cuh): BM
// physical rows a task, BN keys a step, head dim D, STAGES K/V pipeline stages, and the CTAs an
// SM its registers are budgeted for (MIN_BLOCKS, __launch_bounds__).
#pragma once

#include "variant.cuh"

namespace {
constexpr int BM = Config::BM;
constexpr int BN = Config::BN;
constexpr int D = Config::D;
constexpr int STAGES = Config::STAGES;
constexpr int MIN_BLOCKS = Config::MIN_BLOCKS;
}  // namespace
