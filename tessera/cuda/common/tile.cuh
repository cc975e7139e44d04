// The parameters of a variant's tile both attention families read (Config, variant.cuh): BM
// physical rows a task, BN keys a step, head dim D, STAGES K/V pipeline stages, and the CTAs an
// SM its registers are budgeted for (MIN_BLOCKS, __launch_bounds__).
#pragma once

#include "variant.cuh"

namespace {
// Whether the variant's Config sets INT8 (the Hopper forward's 8-bit form; other sources' Configs
// have no such field).
template <class C, class = void>
struct Int8Of { static constexpr bool value = false; };
template <class C>
struct Int8Of<C, decltype((void)C::INT8)> { static constexpr bool value = C::INT8 != 0; };

constexpr bool INT8 = Int8Of<Config>::value;
constexpr int ELEM_BYTES = INT8 ? 1 : 2;  // bytes of a Q, K or V element
constexpr int BM = Config::BM;
constexpr int BN = Config::BN;
constexpr int D = Config::D;
constexpr int STAGES = Config::STAGES;
constexpr int MIN_BLOCKS = Config::MIN_BLOCKS;
}  // namespace
