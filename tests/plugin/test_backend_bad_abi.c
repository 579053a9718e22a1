/* A backend plugin built for a backend ABI version kiln does not speak: kiln must refuse it,
 * naming both versions, and register nothing of it. */
#include "kiln/backend_plugin.h"

static const kiln_backend_plugin table = {999u, "badabi", "badabi-cc", "units", 0, 0};

__attribute__((visibility("default"))) const kiln_backend_plugin* kiln_backend_plugin_entry(void) { return &table; }
