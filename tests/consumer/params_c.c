/* The installed parameter blocks compiled as C11: a plugin written in C sees the layout C++ sees. */
#include <stddef.h>

#include "attention/params.h"
#include "moe/params.h"

size_t consumer_c_layout(int which) {
  switch (which) {
    case 0: return sizeof(KilnPrefillParams);
    case 1: return offsetof(KilnPrefillParams, tensor_maps);
    case 2: return sizeof(KilnDecodeParams);
    case 3: return sizeof(KilnKvAppendParams);
    case 4: return sizeof(KilnMoeParams);
    case 5: return offsetof(KilnMoeParams, tensor_maps);
    default: return 0;
  }
}
