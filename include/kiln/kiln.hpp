// kiln's C++ API in one include.
#pragma once

#include "kiln/cache.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/log.hpp"
#include "kiln/ops.hpp"
#include "kiln/platform.hpp"
#include "kiln/registry.hpp"
#include "kiln/tensor.hpp"
#include "kiln/warmup.hpp"
