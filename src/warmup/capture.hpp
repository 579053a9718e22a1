// Shape capture (kiln/warmup.hpp: set_capture_file, KILN_CAPTURE).
#pragma once

#include "kiln/registry.hpp"

namespace kiln::detail {

// Adds the signature to the capture manifest, if capturing; once per signature per process.
// Never throws: a capture problem is logged once and capturing stops.
void capture_signature(const Signature& sig);

}  // namespace kiln::detail
