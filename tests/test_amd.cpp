// The AMD backend without an AMD GPU (none is available to this project): real compiles by
// hipRTC (Debian's ROCm 5.2: gfx90a) and by the offline clang (gfx942, gfx950), code objects
// read back and disassembled, and the runtime's answers on a machine with no AMD GPU.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/hip/code_object.hpp"
#include "backends/hip/device_properties.hpp"
#include "backends/hip/hiprtc.hpp"
#include "backends/hip/offline_clang.hpp"
#include "jit/compiler.hpp"
#include "jit/pipeline.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/platform.hpp"
#include "support/signatures.hpp"

#if __has_include(<hip/hip_runtime_api.h>)
#define KILN_TEST_HAVE_HIP_HEADER 1
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;
using detail::hip::read_code_object;

// Sets the AMD compiler for one test and restores the settings after it.
class AmdCompilerScope {
 public:
  explicit AmdCompilerScope(AmdCompiler compiler) : saved_(jit_settings()) {
    JitSettings s = saved_;
    s.amd_compiler = compiler;
    set_jit_settings(s);
  }
  ~AmdCompilerScope() { set_jit_settings(saved_); }

 private:
  JitSettings saved_;
};

std::string disassemble(const std::vector<uint8_t>& binary, const std::string& arch) {
  const fs::path file = fs::path(testing::TempDir()) / fmt::format("kiln-amd-{}-{}.co", arch, binary.size());
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(binary.data()), static_cast<std::streamsize>(binary.size()));
  const std::string command = fmt::format("{} -d --mcpu={} {} 2>&1", KILN_TEST_LLVM_OBJDUMP, arch, file.string());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), &pclose);
  std::string text;
  std::array<char, 4096> buffer{};
  while (pipe && fgets(buffer.data(), static_cast<int>(buffer.size()), pipe.get()) != nullptr) text += buffer.data();
  return text;
}

std::vector<uint8_t> file_bytes(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes(limit);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(limit));
  bytes.resize(static_cast<size_t>(in.gcount()));
  return bytes;
}

// Every AMD registration of kiln's portable kernels, over the shapes kiln's manifests use.
std::vector<Signature> amd_signatures() {
  std::vector<Signature> sigs;
  for (const char* dtype : {"bf16", "f16"}) {
    for (int d : {64, 128}) {
      sigs.push_back(test::prefill_signature(dtype, d, 8));
      sigs.push_back(test::decode_signature(dtype, dtype, d, 8));
      sigs.push_back(test::extend_signature(dtype, dtype, d, 8));
    }
  }
  sigs.push_back(test::prefill_signature("f16", 256, 2));
  sigs.push_back(test::extend_signature("bf16", "bf16", 256, 2));
  sigs.push_back(test::decode_signature("bf16", "e4m3", 128, 8));
  sigs.push_back(test::extend_signature("bf16", "e4m3", 128, 8));
  sigs.push_back(test::extend_signature("f16", "e4m3", 256, 8));
  sigs.push_back(test::kv_append_signature("bf16", "bf16"));
  sigs.push_back(test::kv_append_signature("f16", "e4m3"));
  sigs.push_back(test::moe_signature("bf16", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "f32"));
  sigs.push_back(test::moe_signature("mxfp4", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "f32"));
  sigs.push_back(test::moe_signature("bf16", 4096, 14336, 8, 2, "f32", "silu_glu", "concatenated", "none"));
  Signature w4a8 = test::moe_signature("mxfp4", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  w4a8.set("act_dtype", "e4m3");
  sigs.push_back(w4a8);
  return sigs;
}

TEST(AmdOfflineClang, CompilesEveryAmdKernelForGfx942AndGfx950) {
  std::string why;
  ASSERT_TRUE(detail::hip::find_clang(&why)) << why << " (scripts/install-deps.sh installs clang-22)";
  AmdCompilerScope scope(AmdCompiler::kClang);
  for (const char* arch : {"gfx942", "gfx950"}) {
    for (const Signature& sig : amd_signatures()) {
      SCOPED_TRACE(fmt::format("{} {}", arch, sig.canonical()));
      const CompiledKernel k = compile_for_target(sig, arch);
      EXPECT_EQ(Registry::global().find(k.kernel)->backend, Backend::kHip) << k.kernel;
      EXPECT_EQ(k.compiler.rfind("clang ", 0), 0u) << k.compiler;
      const auto info = read_code_object(k.binary);
      EXPECT_EQ(info.arch, arch);
      EXPECT_EQ(info.kernels, std::vector<std::string>{k.lowered_name});
      const std::string text = disassemble(k.binary, arch);
      EXPECT_NE(text.find("s_endpgm"), std::string::npos) << text.substr(0, 2000);
      EXPECT_NE(text.find("global_load"), std::string::npos);
      if (sig.op().mode == kModeKvAppend) {
        // Plain copies (or e4m3 conversions) of 16-byte chunks: no MFMA, no cross-lane traffic.
        EXPECT_EQ(k.kernel, "attention.kv_append.amd");
        EXPECT_NE(text.find("global_store"), std::string::npos);
        continue;
      }
      const bool paged_mfma = sig.op().mode == kModeExtend;
      if (sig.op().mode == kModePrefill || paged_mfma) {
        // The matrix-core prefill kernel (paged for extend, a 16-bit or e4m3 cache; head_dim up to
        // 256): CDNA4's 32x32x16 MFMA on gfx950, CDNA3's 32x32x8 on gfx942, and no scratch (spills).
        EXPECT_EQ(k.kernel, paged_mfma ? "attention.extend.mfma" : "attention.prefill.mfma");
        const std::string mfma = std::string(arch) == "gfx950" ? "v_mfma_f32_32x32x16_" : "v_mfma_f32_32x32x8_";
        EXPECT_NE(text.find(mfma + (sig.get("dtype") == "bf16" ? "bf16" : "f16")), std::string::npos) << mfma;
        EXPECT_EQ(text.find("scratch_"), std::string::npos);
      }
      if (sig.op().mode == kModeDecode) {
        // The matrix-core decode kernel, the same instructions (an e4m3 cache widened to q's type).
        EXPECT_EQ(k.kernel, "attention.decode.mfma");
        const std::string mfma = std::string(arch) == "gfx950" ? "v_mfma_f32_32x32x16_" : "v_mfma_f32_32x32x8_";
        EXPECT_NE(text.find(mfma + (sig.get("dtype") == "bf16" ? "bf16" : "f16")), std::string::npos) << mfma;
        // A split pair's ranges merge through the workspace: a ticket drawn after an agent-scope
        // release, the last range's reads after an acquire that invalidates the caches.
        EXPECT_NE(text.find("global_atomic_add"), std::string::npos);
        EXPECT_NE(text.find("buffer_inv"), std::string::npos);
      }
      if (sig.op().mode == kModeApply) {
        // The matrix-core MoE kernel: 16-byte global loads of weight rows, and a grid barrier
        // whose agent-scope acquire invalidates the caches (buffer_inv) between phases. MXFP4 on
        // gfx950: CDNA4's scaled MFMA takes the e2m1 weights as stored (cbsz:4) and e4m3
        // activations (W4A8's, or bf16's two terms) with both e8m0 scales, and no bf16 MFMA is
        // left. Otherwise the bf16 MFMAs, with MXFP4 decoded to bf16 first.
        EXPECT_EQ(k.kernel, "moe.apply.mfma");
        const bool scaled = sig.get("weights") == "mxfp4" && std::string(arch) == "gfx950";
        EXPECT_EQ(text.find("v_mfma_scale_f32_32x32x64_f8f6f4") != std::string::npos, scaled);
        if (scaled) {
          EXPECT_NE(text.find("cbsz:4"), std::string::npos);
          EXPECT_EQ(text.find("v_mfma_f32_32x32x16_bf16"), std::string::npos);
        } else {
          EXPECT_NE(text.find(std::string(arch) == "gfx950" ? "v_mfma_f32_32x32x16_bf16" : "v_mfma_f32_32x32x8_bf16"), std::string::npos);
        }
        EXPECT_NE(text.find("global_load_dwordx4"), std::string::npos);
        EXPECT_NE(text.find("buffer_inv"), std::string::npos);
        EXPECT_NE(text.find("global_atomic_add"), std::string::npos);
        continue;
      }
      // The portable warp reduction on AMD: a cross-lane permute through LDS hardware.
      EXPECT_NE(text.find("ds_bpermute_b32"), std::string::npos);
      // bf16 rounding is one instruction on gfx950 (CDNA4) and a software sequence on gfx942.
      const bool bf16_out = sig.get("dtype") == "bf16";
      EXPECT_EQ(text.find("v_cvt_pk_bf16_f32") != std::string::npos, bf16_out && std::string(arch) == "gfx950");
    }
  }
}

TEST(AmdOfflineClang, KeepsFeatureFlagsOfTheTarget) {
  AmdCompilerScope scope(AmdCompiler::kClang);
  const CompiledKernel k = compile_for_target(test::decode_signature("bf16", "bf16", 64, 8), "gfx942:sramecc+:xnack-");
  EXPECT_EQ(read_code_object(k.binary).target, "gfx942:sramecc+:xnack-");
  const CompiledKernel plain = compile_for_target(test::decode_signature("bf16", "bf16", 64, 8), "gfx942");
  EXPECT_NE(k.key, plain.key);  // the full target name is part of the key
}

TEST(AmdOfflineClang, BuildsAreReproducible) {
  const Platform platform = platform_for_target("gfx950");
  const auto spec = Registry::global().select(test::prefill_signature("bf16", 128, 8), platform);
  AmdCompilerScope scope(AmdCompiler::kClang);
  const detail::CompileRequest request = detail::build_request(*spec, test::prefill_signature("bf16", 128, 8), platform);
  const auto first = detail::compile_in_this_process(request, 120);
  const auto second = detail::compile_in_this_process(request, 120);
  EXPECT_EQ(first.binary, second.binary);
  EXPECT_EQ(first.lowered_name, second.lowered_name);
}

TEST(AmdOfflineClang, CompileErrorCarriesClangsLog) {
  detail::CompileRequest r;
  r.compiler = detail::CompilerKind::kClang;
  r.kernel_name = "broken";
  r.source_name = "broken.cu";
  r.source = "#include \"common/prelude.cuh\"\n__global__ void broken() { undeclared_thing(); }\n";
  r.headers = {{"common/prelude.cuh", "#pragma once\n#define __global__ __attribute__((global))\n"}};
  r.options = {"-std=c++17", "-O3"};
  r.target = "gfx942";
  try {
    detail::compile_in_this_process(r, 120);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCompileFailed);
    EXPECT_NE(e.compile_log().find("undeclared_thing"), std::string::npos) << e.compile_log();
    EXPECT_EQ(e.compile_target(), "gfx942");
  }
  r.headers = {{"../escape.h", "x"}};
  EXPECT_THROW(detail::compile_in_this_process(r, 120), Error);
}

TEST(AmdHiprtc, CompilesGfx90aThroughTheRealApi) {
  ASSERT_FALSE(detail::hip::hiprtc_refuses("gfx90a"))
      << *detail::hip::hiprtc_refuses("gfx90a") << " (scripts/install-deps.sh installs Debian's hipRTC)";
  AmdCompilerScope scope(AmdCompiler::kHiprtc);
  Signature w4a8 = test::moe_signature("mxfp4", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  w4a8.set("act_dtype", "e4m3");  // quantized activations through the bf16 MFMAs
  for (const Signature& sig :
       {test::prefill_signature("bf16", 64, 8), test::decode_signature("f16", "f16", 128, 4), test::extend_signature("bf16", "bf16", 64, 8),
        test::moe_signature("mxfp4", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "f32"), w4a8}) {
    const CompiledKernel k = compile_for_target(sig, "gfx90a");
    EXPECT_EQ(k.compiler.rfind("hiprtc ", 0), 0u) << k.compiler;
    const auto info = read_code_object(k.binary);
    EXPECT_EQ(info.arch, "gfx90a");
    ASSERT_EQ(info.kernels.size(), 1u);
    EXPECT_EQ(info.kernels.front(), k.lowered_name);
    const std::string text = disassemble(k.binary, "gfx90a");
    EXPECT_NE(text.find("ds_bpermute_b32"), std::string::npos);
    if (sig.op().mode == kModePrefill || sig.op().mode == kModeExtend || sig.op().mode == kModeApply) {
      EXPECT_NE(text.find("v_mfma_f32_32x32x8bf16_1k"), std::string::npos);
    }
  }
}

TEST(AmdHiprtc, RefusesTargetsItsReleaseDoesNotKnowInsteadOfCrashing) {
  ASSERT_FALSE(detail::hip::hiprtc_refuses("gfx90a"));
  const auto why = detail::hip::hiprtc_refuses("gfx942");
  if (!why) GTEST_SKIP() << "this hipRTC is new enough for gfx942";
  EXPECT_NE(why->find("does not know target gfx942"), std::string::npos) << *why;
  AmdCompilerScope scope(AmdCompiler::kHiprtc);
  try {
    compile_for_target(test::prefill_signature("bf16", 64, 8), "gfx942");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("gfx942"), std::string::npos) << e.what();
  }
}

TEST(AmdCompilerChoice, AutoTakesHiprtcWhereItKnowsTheTargetElseClang) {
  AmdCompilerScope scope(AmdCompiler::kAuto);
  const auto on_90a = compile_for_target(test::prefill_signature("f16", 64, 8), "gfx90a");
  const auto on_942 = compile_for_target(test::prefill_signature("f16", 64, 8), "gfx942");
  EXPECT_EQ(on_90a.compiler.rfind("hiprtc ", 0), 0u) << on_90a.compiler;
  EXPECT_EQ(on_942.compiler.rfind("clang ", 0), 0u) << on_942.compiler;
  AmdCompilerScope clang(AmdCompiler::kClang);
  const auto by_clang = compile_for_target(test::prefill_signature("f16", 64, 8), "gfx90a");
  EXPECT_NE(by_clang.key, on_90a.key) << "the key records the compiler";
}

TEST(AmdCompilerChoice, ReportListsWhatEachCompilerBuildsHere) {
  const auto reports = available_compilers();
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[1].compiler, "hiprtc");
  EXPECT_EQ(reports[1].targets, std::vector<std::string>{"gfx90a"}) << reports[1].note;  // Debian's ROCm 5.2
  EXPECT_NE(reports[1].note.find("refuses gfx942, gfx950"), std::string::npos) << reports[1].note;
  EXPECT_EQ(reports[2].compiler, "clang");
  EXPECT_EQ(reports[2].targets, (std::vector<std::string>{"gfx90a", "gfx942", "gfx950"})) << reports[2].note;
}

TEST(AmdCompilerChoice, BadSettingsAreClearErrors) {
  ::setenv("KILN_AMD_COMPILER", "nvcc", 1);
  try {
    detail::jit_settings_from_environment();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_AMD_COMPILER='nvcc'"), std::string::npos) << e.what();
  }
  ::unsetenv("KILN_AMD_COMPILER");
  ::setenv("KILN_CLANG", "/bin/true", 1);
  std::string why;
  EXPECT_FALSE(detail::hip::find_clang(&why));
  EXPECT_NE(why.find("KILN_CLANG=/bin/true"), std::string::npos) << why;
  ::unsetenv("KILN_CLANG");
}

TEST(AmdCodeObject, MalformedInputIsAClearError) {
  EXPECT_THROW(read_code_object({}), Error);
  EXPECT_THROW(read_code_object(std::vector<uint8_t>(100, 0)), Error);
  try {
    read_code_object(file_bytes("/proc/self/exe", 1 << 16));  // an x86-64 ELF
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("EM_AMDGPU"), std::string::npos) << e.what();
  }
  AmdCompilerScope scope(AmdCompiler::kClang);
  std::vector<uint8_t> binary = compile_for_target(test::prefill_signature("bf16", 64, 8), "gfx950").binary;
  for (size_t cut : {size_t{64}, binary.size() / 2, binary.size() - 1}) {
    std::vector<uint8_t> truncated(binary.begin(), binary.begin() + static_cast<std::ptrdiff_t>(cut));
    try {
      read_code_object(truncated);  // may still parse if nothing kiln reads was cut
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(AmdCodeObject, TargetMatchingFollowsFeatureFlags) {
  using detail::hip::target_runs;
  EXPECT_TRUE(target_runs("gfx942", "gfx942:sramecc+:xnack-"));  // built for "any"
  EXPECT_TRUE(target_runs("gfx942:xnack-", "gfx942:sramecc+:xnack-"));
  EXPECT_FALSE(target_runs("gfx942:xnack+", "gfx942:sramecc+:xnack-"));
  EXPECT_FALSE(target_runs("gfx942:xnack-", "gfx942"));  // the device may be xnack+
  EXPECT_FALSE(target_runs("gfx950", "gfx942"));
  detail::hip::CodeObjectInfo info;
  info.target = "gfx942";
  info.kernels = {"_ZN4kiln1aILi1EEEvPf", "_ZN4kiln1aILi2EEEvPf"};
  EXPECT_EQ(detail::hip::find_kernel(info, "kiln::a<2>"), "_ZN4kiln1aILi2EEEvPf");
  try {
    detail::hip::find_kernel(info, "kiln::a<3>");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("void kiln::a<1>(float*)"), std::string::npos) << e.what();
  }
}

TEST(AmdRuntime, NoAmdGpuIsSaidPlainly) {
  const DeviceReport r = detect_devices();
  for (const auto& d : r.devices) {
    if (d.vendor == Vendor::kAmd) GTEST_SKIP() << "an AMD GPU is present";
  }
  bool said = false;
  for (const auto& note : r.notes) said = said || note.rfind("AMD GPUs: ", 0) == 0;
  EXPECT_TRUE(said) << fmt::format("{}", fmt::join(r.notes, "\n"));
}

#ifdef KILN_TEST_HAVE_HIP_HEADER
TEST(AmdRuntime, PropertyOffsetsMatchRocmsHeader) {
  using L = detail::hip::DevicePropertiesR0000;
  EXPECT_EQ(sizeof(hipDeviceProp_t), L::kSize);
  EXPECT_EQ(offsetof(hipDeviceProp_t, name), L::kName);
  EXPECT_EQ(offsetof(hipDeviceProp_t, sharedMemPerBlock), L::kSharedMemPerBlock);
  EXPECT_EQ(offsetof(hipDeviceProp_t, warpSize), L::kWarpSize);
  EXPECT_EQ(offsetof(hipDeviceProp_t, multiProcessorCount), L::kMultiProcessorCount);
  EXPECT_EQ(offsetof(hipDeviceProp_t, l2CacheSize), L::kL2CacheSize);
  EXPECT_EQ(offsetof(hipDeviceProp_t, gcnArchName), L::kGcnArchName);
}
#endif

}  // namespace
}  // namespace kiln
