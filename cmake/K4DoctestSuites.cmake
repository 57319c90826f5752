# K4DoctestSuites.cmake -- runs inside ctest (included from a file k4_add_doctest writes):
# registers one ctest entry per doctest test suite of a test binary, plus one for the test
# cases outside every suite. The binary is asked at ctest time (--list-test-suites), so a new
# TEST_SUITE needs no CMake edit and no re-configure.
#
# Inputs (set by the including file): K4_DT_NAME, K4_DT_EXE, K4_DT_LABELS, K4_DT_WORKDIR.
# Entries: "<name>/<suite>" runs `<exe> -ts=<suite>`; "<name>/(no suite)" runs the rest.
# Labels: K4_DT_LABELS, plus "exhaustive" for suites whose name starts with "exhaustive"
# (so `ctest -LE exhaustive` skips them). Suite names must not contain ',', '*' or '?'
# (doctest's filter syntax).

if(NOT EXISTS "${K4_DT_EXE}")
  # Not built: one entry that fails and says so.
  add_test("${K4_DT_NAME}" "${K4_DT_EXE}")
  set_tests_properties("${K4_DT_NAME}" PROPERTIES LABELS "${K4_DT_LABELS}" ENVIRONMENT "OMP_WAIT_POLICY=passive")
  return()
endif()

execute_process(
  COMMAND "${K4_DT_EXE}" --list-test-suites --no-colors=true
  WORKING_DIRECTORY "${K4_DT_WORKDIR}"
  OUTPUT_VARIABLE _k4_out
  ERROR_VARIABLE _k4_err
  RESULT_VARIABLE _k4_rc)

if(NOT _k4_rc EQUAL 0)
  # The binary cannot even list its suites: run it whole, so that the failure is shown.
  add_test("${K4_DT_NAME}" "${K4_DT_EXE}")
  set_tests_properties("${K4_DT_NAME}" PROPERTIES LABELS "${K4_DT_LABELS}" WORKING_DIRECTORY "${K4_DT_WORKDIR}" ENVIRONMENT "OMP_WAIT_POLICY=passive")
  return()
endif()

string(REPLACE "\n" ";" _k4_lines "${_k4_out}")
set(_k4_suites "")
foreach(_k4_line IN LISTS _k4_lines)
  string(STRIP "${_k4_line}" _k4_line)
  if(_k4_line STREQUAL "" OR _k4_line MATCHES "^=+$" OR _k4_line MATCHES "^\\[doctest\\]")
    continue()
  endif()
  list(APPEND _k4_suites "${_k4_line}")
endforeach()

foreach(_k4_suite IN LISTS _k4_suites)
  set(_k4_test "${K4_DT_NAME}/${_k4_suite}")
  set(_k4_labels "${K4_DT_LABELS}")
  if(_k4_suite MATCHES "^exhaustive")
    list(APPEND _k4_labels exhaustive)
  else()
    list(APPEND _k4_labels fast)
  endif()
  add_test("${_k4_test}" "${K4_DT_EXE}" "--test-suite=${_k4_suite}" --no-colors=true)
  set_tests_properties("${_k4_test}" PROPERTIES LABELS "${_k4_labels}" WORKING_DIRECTORY "${K4_DT_WORKDIR}" ENVIRONMENT "OMP_WAIT_POLICY=passive")
  # the exhaustive sweeps are the longest entries (minutes): ctest -j starts them first (COST)
  if(_k4_suite MATCHES "^exhaustive")
    set_tests_properties("${_k4_test}" PROPERTIES COST 300)
  endif()
endforeach()

# The test cases in no suite: exclude every named suite; registered only if there are any.
set(_k4_exclude "")
if(_k4_suites)
  list(JOIN _k4_suites "," _k4_joined)
  set(_k4_exclude "--test-suite-exclude=${_k4_joined}")
endif()
execute_process(
  COMMAND "${K4_DT_EXE}" --list-test-cases --no-colors=true ${_k4_exclude}
  WORKING_DIRECTORY "${K4_DT_WORKDIR}"
  OUTPUT_VARIABLE _k4_out
  RESULT_VARIABLE _k4_rc)
set(_k4_loose 1)
if(_k4_rc EQUAL 0 AND _k4_out MATCHES "unskipped test cases passing the current filters: ([0-9]+)")
  set(_k4_loose "${CMAKE_MATCH_1}")
endif()
if(NOT _k4_loose EQUAL 0)
  set(_k4_test "${K4_DT_NAME}/(no suite)")
  add_test("${_k4_test}" "${K4_DT_EXE}" ${_k4_exclude} --no-colors=true)
  set_tests_properties("${_k4_test}" PROPERTIES LABELS "${K4_DT_LABELS};fast" WORKING_DIRECTORY "${K4_DT_WORKDIR}" ENVIRONMENT "OMP_WAIT_POLICY=passive")
endif()
