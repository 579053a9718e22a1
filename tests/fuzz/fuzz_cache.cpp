// Fuzzes the cache's readers with arbitrary files: as a bundle to import, as a seed database and
// as the writable kiln.db. Nothing may crash, and an import must never install a row that fails
// verification.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "cache/kernel_cache.hpp"
#include "kiln/cache.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path root = [] {
    kiln::set_log_level(kiln::LogLevel::kOff);
    fs::path p = fs::temp_directory_path() / ("kiln-fuzz-cache-" + std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  const fs::path bundle = root / "bundle.kiln";
  const fs::path dir = root / "cache";
  fs::remove_all(dir);
  fs::remove(bundle);
  std::ofstream(bundle, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));

  const kiln::detail::KernelKey key{1, 2};
  try {
    kiln::cache_import(bundle.string(), dir.string());
    if (!kiln::cache_verify(false, dir.string()).problems.empty()) __builtin_trap();  // a bad row got in
  } catch (const kiln::Error&) {
  }
  {  // as a seed under an empty writable cache
    kiln::detail::KernelCache cache((root / "seeded").string(), {bundle.string()}, 1 << 20, kiln::detail::KernelCache::Mode::kServe);
    cache.lookup(key, "sm_90a", "nvrtc 13.0 x");
  }
  {  // as the writable database itself
    fs::remove_all(root / "direct");
    fs::create_directories(root / "direct");
    fs::permissions(root / "direct", fs::perms::owner_all);
    fs::copy_file(bundle, root / "direct" / "kiln.db");
    fs::permissions(root / "direct" / "kiln.db", fs::perms::owner_read | fs::perms::owner_write);
    kiln::detail::KernelCache cache((root / "direct").string(), {}, 1 << 20, kiln::detail::KernelCache::Mode::kServe);
    cache.lookup(key, "sm_90a", "nvrtc 13.0 x");  // never throws: a bad database degrades
    try {
      cache.list();  // maintenance: may report the database's problem as kiln::Error
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
