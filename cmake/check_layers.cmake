# The layers_enforced test: a source in a layer's include root compiles when it includes a header
# of its own layer or one below, and fails with "No such file" when it includes one above, so an
# upward #include stays a build error.
#   cmake -DCXX=<compiler> -DBUILD=<build dir> -DSOURCE=<source dir> -DWORK=<scratch dir> -P check_layers.cmake
file(MAKE_DIRECTORY ${WORK})
function(compile_with layer header expect_ok)
  file(WRITE ${WORK}/probe_${layer}.cpp "#include \"${header}\"\nint main() { return 0; }\n")
  execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${BUILD}/layer-includes/${layer} -I${SOURCE}/include
                          -isystem /usr/local/cuda/include ${WORK}/probe_${layer}.cpp
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "layers_enforced: the ${layer} layer cannot include ${header}, which it may:\n${err}")
  endif()
  if(NOT expect_ok AND (rc EQUAL 0 OR NOT err MATCHES "No such file"))
    message(FATAL_ERROR "layers_enforced: the ${layer} layer could include ${header}, a layer above it (rc ${rc}):\n${err}")
  endif()
endfunction()
compile_with(cache "cache/kernel_cache.hpp" TRUE)
compile_with(cache "jit/pipeline.hpp" FALSE)
compile_with(backends "backends/backend.hpp" TRUE)
compile_with(backends "jit/operator_call.hpp" FALSE)
compile_with(jit "jit/pipeline.hpp" TRUE)
compile_with(jit "ops/validate.hpp" FALSE)
compile_with(jit "warmup/capture.hpp" FALSE)
compile_with(ops "jit/operator_call.hpp" TRUE)
compile_with(ops "warmup/capture.hpp" FALSE)
compile_with(registry "kernels/portable_kernel.hpp" FALSE)
message(STATUS "layers_enforced: upward includes fail, downward ones compile")
