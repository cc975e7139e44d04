// The parameters of a variant's tile both attention families read (Config, variant.cuh): BM
// physical rows a task, BN keys a step, head dim D, STAGES K/V pipeline stages, and the CTAs an
// SM its registers are budgeted for (MIN_BLOCKS, __launch_bounds__).
#pragma once

#include "variant.cuh"

namespace {
// The variant's Config::INT8 (the Hopper forward's 8-bit forms; other sources' Configs have no
// such field: 0).
template <class C, class = void>
struct Int8Of { static constexpr int value = 0; };
template <class C>
struct Int8Of<C, decltype((void)C::INT8)> { static constexpr int value = C::INT8; };

constexpr bool INT8 = Int8Of<Config>::value != 0;      // Q and K in int8: 8-bit scores
constexpr bool INT8_PV = Int8Of<Config>::value == 1;   // P and V in 8 bits too
constexpr int ELEM_BYTES = INT8 ? 1 : 2;               // bytes of a Q or K element
constexpr int V_ELEM_BYTES = INT8_PV ? 1 : 2;          // of a V element
constexpr int BM = Config::BM;
constexpr int BN = Config::BN;
constexpr int D = Config::D;
constexpr int STAGES = Config::STAGES;
constexpr int MIN_BLOCKS = Config::MIN_BLOCKS;
}  // namespace
