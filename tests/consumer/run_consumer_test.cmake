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
