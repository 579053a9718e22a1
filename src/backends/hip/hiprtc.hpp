// hipRTC, loaded at first use: libhiprtc of ROCm 6 and newer, or libamdhip64 of ROCm 5, where
// hipRTC lives inside the runtime library.
#pragma once

#include <optional>
#include <string>

#include "backends/compile_request.hpp"

namespace kiln::detail::hip {

// Why hipRTC cannot be loaded here, or nullopt when it can. Never throws.
std::optional<std::string> hiprtc_unavailable();

// Why kiln will not hand `target` to the hipRTC it finds, or nullopt when it will. hipRTC is only
// given targets its ROCm release is known to support (ROCm 5's hipRTC aborts the process on
// gfx940 and newer); this also covers a hipRTC that cannot be loaded. Never throws.
std::optional<std::string> hiprtc_refuses(const std::string& target);

// Compiles request.source to a code object for request.target and resolves the lowered name of
// request.name_expression. Throws kiln::Error(kCompileFailed) with the log, kUnsupported when
// hiprtc_refuses() the target, kDriverError when hipRTC cannot be loaded.
CompileResult hiprtc_compile(const CompileRequest& request);

// "hiprtc 5.2.21153 <hash>": the ROCm release read off the library's file name, plus a hash of
// that file's name and size.
const std::string& hiprtc_identity();

// "<path>|<size>|<mtime ns>|<inode>" of the library hipRTC was loaded from (loads it).
std::optional<std::string> hiprtc_library_fingerprint();

}  // namespace kiln::detail::hip
