# Installs the kiln build into WORK_DIR/prefix, builds tests/consumer against it, runs both
# consumers. Fails on any step.
file(REMOVE_RECURSE "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install "${KILN_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE}" -B "${WORK_DIR}/build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build" -j 2)
# Each compiles a kernel: the shared library through the worker installed beside it; the static
# one, whose program has no worker beside it, in its own process with a warning, or through the
# worker KILN_COMPILE_WORKER names.
function(run_expect expected unexpected tag)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env KILN_CACHE_DIR=${WORK_DIR}/cache-${tag} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
  string(FIND "${out}${err}" "${expected}" found)
  if(found EQUAL -1)
    message(FATAL_ERROR "'${expected}' not in the output of ${ARGN}")
  endif()
  if(NOT unexpected STREQUAL "")
    string(FIND "${out}${err}" "${unexpected}" found)
    if(NOT found EQUAL -1)
      message(FATAL_ERROR "'${unexpected}' in the output of ${ARGN}")
    endif()
  endif()
endfunction()
run_expect("(compiled)" "compiling in this process" shared "${WORK_DIR}/build/consumer_shared")
run_expect("compiling in this process" "" static "${WORK_DIR}/build/consumer_static")
run_expect("(compiled)" "compiling in this process" static-worker
           KILN_COMPILE_WORKER=${WORK_DIR}/prefix/libexec/kiln/kiln-compile-worker "${WORK_DIR}/build/consumer_static")

# The kernel-plugin template (examples/kernel-plugin) builds against the installed kiln, loads
# through KILN_PLUGIN_PATH, and its kernel compiles through the JIT.
run(${CMAKE_COMMAND} -S "${PLUGIN_TEMPLATE_SOURCE}" -B "${WORK_DIR}/plugin-build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/plugin-build" -j 2)
set(plugin_env KILN_PLUGIN_PATH=${WORK_DIR}/plugin-build/acme_kiln_plugin.so KILN_PLUGINS_OUTRANK=1)
run_expect("acme.attention.kv_append.rows" "" plugin-list ${plugin_env} "${WORK_DIR}/prefix/bin/kiln" list)
run_expect("kv_dtype=e4m3 is not one of the plugin's kv_dtype=bf16|f16" "" plugin-explain ${plugin_env} "${WORK_DIR}/prefix/bin/kiln" explain kv_cache_append
           --sig dtype=f16,kv_dtype=e4m3 --target sm_90a)
# No kernel runs mixed 16-bit dtypes: explain exits 3, and says why the plugin declined.
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${plugin_env} "${WORK_DIR}/prefix/bin/kiln" explain kv_cache_append
                --sig dtype=f16,kv_dtype=bf16 --target sm_90a RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(FIND "${out}${err}" "acme copies rows: the cache must hold the rows' own dtype" found)
if(NOT rc EQUAL 3 OR found EQUAL -1)
  message(FATAL_ERROR "explain of a mixed-dtype signature (exit ${rc}) did not give the plugin's reason:\n${out}${err}")
endif()
run_expect("\"name_expression\": \"acme_kv_append<unsigned short>\"" "" plugin-compile ${plugin_env} "${WORK_DIR}/prefix/bin/kiln" compile
           kv_cache_append --sig dtype=bf16,kv_dtype=bf16 --target sm_90a --json)

# The backend-plugin template (examples/backend-plugin) builds against the installed kiln; its
# backend shows as a device, and its prefill kernel, compiled by the host's C compiler and run on
# the CPU, matches float64 in `kiln check`.
run(${CMAKE_COMMAND} -S "${BACKEND_TEMPLATE_SOURCE}" -B "${WORK_DIR}/backend-build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/backend-build" -j 2)
set(backend_env KILN_PLUGIN_PATH=${WORK_DIR}/backend-build/hostcc_kiln_backend.so)
run_expect("hostcc hostcc-cpu (the host CPU" "" backend-devices ${backend_env} "${WORK_DIR}/prefix/bin/kiln" devices)
run_expect("bound 1e-02 (output dtype): PASS" "" backend-check ${backend_env} "${WORK_DIR}/prefix/bin/kiln" check mha_prefill
           --shape batch=2,seqlen=33,heads_q=4,heads_kv=2,head_dim=64,causal=1,window=8,sinks=1)
