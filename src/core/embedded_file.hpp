// Files embedded in libkiln at build time (cmake/embed_files.cmake).
#pragma once

namespace kiln::detail {

struct EmbeddedFile {
  const char* name;
  const unsigned char* data;
  unsigned long size;
};

}  // namespace kiln::detail
