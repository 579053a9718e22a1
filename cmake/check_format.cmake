# The format_check test: every C and C++ file git tracks must be exactly what clang-format 14 makes
# of it under .clang-format. Run `git ls-files '*.cpp' '*.hpp' '*.h' '*.cuh' '*.cu' '*.c' | xargs
# clang-format-14 -i` to fix what it reports.
#   cmake -DCLANG_FORMAT=<path> -DROOT=<source dir> -P check_format.cmake
if(NOT CLANG_FORMAT)
  message(FATAL_ERROR "format_check: clang-format 14 was not found at configure time (scripts/install-deps.sh installs it)")
endif()
execute_process(COMMAND ${CLANG_FORMAT} --version OUTPUT_VARIABLE version)
if(NOT version MATCHES "version 14\\.")
  message(FATAL_ERROR "format_check: ${CLANG_FORMAT} is not clang-format 14 (${version}); the tree is formatted with 14")
endif()
execute_process(COMMAND git -C ${ROOT} ls-files *.cpp *.hpp *.h *.cuh *.cu *.c
                OUTPUT_VARIABLE files RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "format_check: git ls-files failed in ${ROOT}")
endif()
string(REPLACE "\n" ";" files "${files}")
list(FILTER files EXCLUDE REGEX "^$")
list(LENGTH files count)
if(count EQUAL 0)
  message(FATAL_ERROR "format_check: git lists no C or C++ files in ${ROOT}")
endif()
execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${files} WORKING_DIRECTORY ${ROOT} RESULT_VARIABLE rc ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "format_check: files differ from clang-format's output:\n${out}")
endif()
message(STATUS "format_check: ${count} files formatted")
