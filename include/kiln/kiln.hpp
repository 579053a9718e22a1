// kiln's C++ API for serving engines, in one include: the operators, tensors, errors, logging and
// the cache, JIT and warm-up settings. Kernel authors and tools add kiln/author.hpp.
#pragma once

#include "kiln/cache.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/log.hpp"
#include "kiln/ops.hpp"
#include "kiln/platform.hpp"
#include "kiln/scratch.hpp"
#include "kiln/signature.hpp"
#include "kiln/tensor.hpp"
#include "kiln/warmup.hpp"
