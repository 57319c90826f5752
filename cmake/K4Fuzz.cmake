# K4Fuzz.cmake -- the libFuzzer targets of tests/fuzz (option K4_FUZZ, clang only).
#
#   cmake -S . -B build-fuzz -G Ninja -DK4_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
#   cmake --build build-fuzz --target k4_fuzz_all          (scripts/fuzz.sh build does both)
#
# With K4_FUZZ every target of the build (k4_reference, k4_golden, ...) is compiled with
# -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all (libFuzzer's coverage
# instrumentation, ASan, UBSan that aborts), and each tests/fuzz/fuzz_<name>.cpp becomes the
# executable build-fuzz/fuzz_<name>, linked with -fsanitize=fuzzer (libFuzzer's main).
# k4_fuzz_all builds them all. HDF5, libomp and libstdc++ are not instrumented (no coverage,
# no ASan checks inside them).
# Needs clang++ with libclang_rt.fuzzer (Debian 12: packages clang and libclang-rt-14-dev).

option(K4_FUZZ "Build the libFuzzer targets of tests/fuzz (clang, ASan + UBSan)" OFF)
if(NOT K4_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "K4_FUZZ needs clang (libFuzzer): configure a separate build directory with "
                      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh build)")
endif()
if(K4_SANITIZE OR K4_STATIC_RUNTIME OR K4_CUDA)
  message(FATAL_ERROR "K4_FUZZ brings its own sanitizers: use it without K4_SANITIZE, K4_STATIC_RUNTIME and K4_CUDA")
endif()

add_compile_options(
  "$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=all;-fno-omit-frame-pointer;-g>")
add_link_options(-fsanitize=address,undefined -fno-sanitize-recover=all)

# Run at the end of the top-level CMakeLists.txt, when k4_golden exists.
function(k4_add_fuzz_targets)
  # The model's element loops (reference/), the tensor diff and the synthetic weights run over
  # megabytes a fuzz input: their comparisons are not traced (-fsanitize-coverage=trace-cmp
  # calls a hook per loop iteration, 20x slower); edge coverage, ASan and UBSan stay.
  file(GLOB_RECURSE _k4_untraced CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/reference/*.cpp")
  file(GLOB _k4_untraced_golden CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/golden/diff/*.cpp"
       "${PROJECT_SOURCE_DIR}/golden/inputs/synth.cpp")
  set_property(SOURCE ${_k4_untraced} ${_k4_untraced_golden} APPEND PROPERTY COMPILE_OPTIONS
               "-fno-sanitize-coverage=trace-cmp")
  file(GLOB _k4_fuzz_sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_*.cpp")
  add_custom_target(k4_fuzz_all)
  foreach(_src IN LISTS _k4_fuzz_sources)
    get_filename_component(_name "${_src}" NAME_WE)
    add_executable(${_name} "${_src}")
    target_link_libraries(${_name} PRIVATE k4_golden)
    target_link_options(${_name} PRIVATE -fsanitize=fuzzer)
    add_dependencies(k4_fuzz_all ${_name})
  endforeach()
endfunction()
cmake_language(DEFER CALL k4_add_fuzz_targets)
