# K4ModelMutants.cmake -- the reference model's mutants (reference/model_mutants.hpp) under the
# independent float64 guard and the property tests.
#
#   k4_model_mutants     the reference built again with K4_MODEL_MUTANTS (the mutant chosen by
#                        the environment variable K4_MODEL_MUTANT) and the test files of the
#                        guard (suite float64) and the properties (properties, properties_index)
# ctest k4_model_mutants/N runs them on mutant N (label "mutants"): a mutant that changes
# meaning must make them fail (WILL_FAIL), one that the registry says changes only bits
# ("survives" non-empty) must pass them; k4_model_mutants/0 (no mutant) must pass. The
# full-size guard and the planted-error cases are left out (time; they test the guard itself).
if(NOT K4_CPU_TEST_SOURCES)
  return()
endif()
set(_k4_mm_tests ${K4_CPU_TEST_SOURCES})
list(FILTER _k4_mm_tests INCLUDE REGEX "/(main|test_float64|test_properties|test_properties_index)\\.cpp$")
add_library(k4_reference_mutants OBJECT ${K4_REFERENCE_SOURCES})
target_compile_definitions(k4_reference_mutants PRIVATE K4_MODEL_MUTANTS)
target_link_libraries(k4_reference_mutants PUBLIC k4::openmp Eigen3::Eigen)
# the mutated reference's objects come first: k4_reference.a (through k4_golden) is then never
# searched for a reference symbol
add_executable(k4_model_mutants ${_k4_mm_tests} $<TARGET_OBJECTS:k4_reference_mutants>)
target_link_libraries(k4_model_mutants PRIVATE k4_test_support k4_golden doctest::doctest)

set(_k4_mm_header "${PROJECT_SOURCE_DIR}/reference/model_mutants.hpp")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_k4_mm_header}")
file(STRINGS "${_k4_mm_header}" _k4_mm_lines REGEX "^  \\{[0-9]+, \"")
set(_k4_mm_args -ts=float64,properties,properties_index "-tce=*full size*,planted*" -aa=1 --no-colors=true)
foreach(_line IN LISTS _k4_mm_lines ITEMS "  {0, \"none\", \"\", \"-\"},")
  string(REGEX MATCH "^  \\{([0-9]+), " _m "${_line}")
  set(_id ${CMAKE_MATCH_1})
  add_test(NAME k4_model_mutants/${_id} COMMAND k4_model_mutants ${_k4_mm_args})
  set_tests_properties(k4_model_mutants/${_id} PROPERTIES LABELS "cpu;mutants"
                       ENVIRONMENT "K4_MODEL_MUTANT=${_id};OMP_WAIT_POLICY=passive")
  if(_line MATCHES ", \"\"},$")  # changes meaning: the guard or a property must kill it
    set_tests_properties(k4_model_mutants/${_id} PROPERTIES WILL_FAIL TRUE)
  endif()
endforeach()
