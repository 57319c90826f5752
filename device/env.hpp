// env.hpp -- the device code's switches from the environment (GPU builds and the host emulation).
#pragma once

#include <cstdlib>

// A switch of the environment that is on unless set to 0 (K4_PDL, K4_FAST_ROT: for timing).
inline bool k4_env_on(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || e[0] != '0';
}
