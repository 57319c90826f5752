# K4Doctest.cmake -- ctest registration of doctest binaries, one ctest entry per test suite.
#
#   k4_add_doctest(<target> LABELS <label>...)
#
# writes <build>/<target>_suites.cmake, which ctest includes when it starts: it asks the
# binary for its suites (K4DoctestSuites.cmake). See there for names and labels.

set(K4_DOCTEST_SUITES_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/K4DoctestSuites.cmake")

function(k4_add_doctest target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "LABELS")
  set(_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  file(GENERATE OUTPUT "${_file}" CONTENT
"set(K4_DT_NAME [==[${target}]==])
set(K4_DT_EXE [==[$<TARGET_FILE:${target}>]==])
set(K4_DT_LABELS [==[${arg_LABELS}]==])
set(K4_DT_WORKDIR [==[${CMAKE_CURRENT_BINARY_DIR}]==])
include([==[${K4_DOCTEST_SUITES_SCRIPT}]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_file}")
endfunction()
