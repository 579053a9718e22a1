// The OpenCL backend plugin's two tables: the backend (opencl_backend.cpp) and its kernels
// (opencl_kernels.cpp), exported from one shared library.
#pragma once

#include "kiln/backend_plugin.h"
#include "kiln/plugin.h"

namespace kiln_opencl {

const kiln_backend_plugin* backend_table();
const kiln_plugin* kernel_table();

}  // namespace kiln_opencl
