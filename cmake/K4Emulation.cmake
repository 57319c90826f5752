# K4Emulation.cmake -- the kernels' host emulation: device/*.cu compiled as C++ with
# -DK4_HOST_EMULATION (device/emu.hpp stands in for the HIP runtime, device/kernel.hpp runs
# each block body item by item), linked with the GPU suite's stage and golden tests
# (tests/gpu, less the elementwise numerics sweeps and the exact tensor-core tiles' own
# kernels: tests/cpu/test_exact_mma.cpp checks the tiles' host emulation). The kernels written
# as CUDA threads (the K4_FAST=1 path) run on device/simt.hpp's fibers (boost.context).
# It checks the kernels' indexing, orders and phase structure without a GPU;
# the GPU's compiler and arithmetic are the device run's to check (docs/gpu-verification.md).
#
# CPU build only (without K4_CUDA, where device/*.cu are CUDA sources):
#   k4_emu_tests          the emulation suite; ctest entries labelled "emulation" (below)
#   k4_emu_kernels        its kernels (a static library)
#   -DK4_EMU_DEFINES="A=1;B"   extra defines for k4_emu_kernels (a kernel variant, a mutant)
#   k4_emulation_variant(<name> DEFINES <def>...)
#                         another executable <name> of the same suite on kernels built with
#                         the extra defines, e.g. k4_emulation_variant(k4_emu_plant5
#                         DEFINES K4_PLANT_STAGE=5); only device/*.cu are compiled again.

set(K4_EMU_DEFINES "" CACHE STRING "Extra compile definitions (a ;-list) for the emulated kernels of k4_emu_tests")

if(K4_CUDA OR NOT K4_DEVICE_SOURCES)
  return()
endif()

set_source_files_properties(${K4_DEVICE_SOURCES} PROPERTIES LANGUAGE CXX)  # -x c++ (CMP0119)
# boost.context: the fibers that run the warp kernels' threads (device/simt.hpp)
find_package(Boost 1.74 REQUIRED COMPONENTS context)

# The suite's sources, compiled once for every variant: they see the kernels only through
# device/runner.hpp (plain C++).
set(_k4_emu_suite_sources ${K4_GPU_TEST_SOURCES})
list(FILTER _k4_emu_suite_sources EXCLUDE REGEX "(\\.cu|/test_numerics_gpu\\.cpp|/test_exact_mma_gpu\\.cpp)$")
add_library(k4_emu_suite OBJECT ${_k4_emu_suite_sources})
target_link_libraries(k4_emu_suite PUBLIC k4_test_support k4_golden doctest::doctest)

function(k4_emulation_variant name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "KERNELS" "DEFINES")
  if(NOT arg_KERNELS)
    set(arg_KERNELS ${name}_kernels)
  endif()
  add_library(${arg_KERNELS} STATIC ${K4_DEVICE_SOURCES})
  target_compile_definitions(${arg_KERNELS} PRIVATE K4_HOST_EMULATION ${arg_DEFINES})
  target_link_libraries(${arg_KERNELS} PUBLIC k4_reference k4_golden Boost::context)  # runner.cu: the schema table
  add_executable(${name} $<TARGET_OBJECTS:k4_emu_suite>)
  target_link_libraries(${name} PRIVATE ${arg_KERNELS} k4_emu_suite)
endfunction()

k4_emulation_variant(k4_emu_tests KERNELS k4_emu_kernels DEFINES ${K4_EMU_DEFINES})
# Every kernel mutant compiled in, the active one chosen at run time (device/mutants.hpp): the
# kill table (tests/gpu/test_mutants_gpu.cpp, scripts/mutants.sh) runs them all on one build.
k4_emulation_variant(k4_emu_mutants DEFINES K4_MUTANTS)
# The kill table in CI: fails when a mutant survives that the registry does not argue
# equivalent (or an argued one is killed); the table in <build>/mutants.md. CPU time on one
# core: about 3 minutes.
add_test(NAME k4_emu_mutants/kill-table COMMAND k4_emu_mutants -ts=gpu_mutants --no-colors=true)
# COST: ctest -j starts the longest tests first (a fresh clone has no timing of its own), so that
# none of them is left to run alone at the end while the other core idles
set_tests_properties(k4_emu_mutants/kill-table PROPERTIES LABELS "emulation;mutants" TIMEOUT 3600 COST 200
                     ENVIRONMENT "OMP_WAIT_POLICY=passive;K4_MUTANT_TABLE=${CMAKE_BINARY_DIR}/mutants.md")
# The tensor-core kernels' mutants (*_fast.cu), on the K4_FAST=1 path: about 2 minutes of one core.
add_test(NAME k4_emu_mutants/kill-table-fast COMMAND k4_emu_mutants -ts=gpu_mutants --no-colors=true)
set_tests_properties(k4_emu_mutants/kill-table-fast PROPERTIES LABELS "emulation;mutants;tensor-core" TIMEOUT 3600 COST 150
                     ENVIRONMENT "OMP_WAIT_POLICY=passive;K4_FAST=1;K4_MUTANT_TABLE=${CMAKE_BINARY_DIR}/mutants-fast.md")

# ctest entries (label "emulation", in the README's test command and so in CI): every stage
# on the tiny, small and full-size presets, TP 1 / 2 / 4; narrow (S < 5) and wide MoE; the
# plain and the reduce-scatter + all-gather all-reduce on both sides of the threshold (S 11 /
# 12); short, scored and long-path contexts, pad rows, q_len 4 requests; the adversarial
# values; the stage twins (replay entry points); the goldens (gpu_golden: the scenarios incl.
# the special values and the full preset, through k4_device run's path to a dump and a diff).
# Left out: the random sweep (budgeted for the GPU) and the "seeds" case. CPU time on one core
# of the 2-core machine (Release): stages 26 s, all-reduce 34 s, full-preset 28 s (4 GB),
# golden 30 s (2 GB).
set(_k4_emu_env "OMP_WAIT_POLICY=passive")
# The fast path (K4_FAST=1: the integer tensor-core kernels, on device/simt.hpp's threads):
# special values, every S class of the MoE passes (rotated tiles of 1 and 2 uses, one and two
# column groups), the variants, S 11 / 12 of the all-reduce forms, the goldens (special values,
# the full preset's scenario). CPU time on one core (Release): fast-stages 160 s,
# fast-all-reduce 130 s, fast-golden 136 s. The "full preset" case stays on the reference path
# here (its S = 16 steps through the fast kernels take over half an hour emulated).
set(_k4_emu_fast_env "OMP_WAIT_POLICY=passive;K4_FAST=1")
add_test(NAME k4_emu_tests/fast-stages COMMAND k4_emu_tests ${_k4_emu_stages}
         "-tc=plant probe,sanitizer case,stage twins,adversarial,per-rank index scores,paths variants,router variants,pad rows out of the wide MoE,indexer context parallelism" --no-colors=true)
add_test(NAME k4_emu_tests/fast-all-reduce COMMAND k4_emu_tests ${_k4_emu_stages} "-tc=all-reduce forms" --no-colors=true)
add_test(NAME k4_emu_tests/fast-golden COMMAND k4_emu_tests -ts=gpu_golden --no-colors=true)
set_tests_properties(k4_emu_tests/fast-stages k4_emu_tests/fast-all-reduce k4_emu_tests/fast-golden PROPERTIES LABELS "emulation;tensor-core"
                     ENVIRONMENT "${_k4_emu_fast_env}" COST 150)
# The emulation's threads themselves (device/simt.hpp): coordinates, barriers, shuffles, the MMA
# collective, and the errors for a hang or divergent collectives.
add_executable(k4_simt_tests "${PROJECT_SOURCE_DIR}/tests/emu/test_simt.cpp")
target_compile_definitions(k4_simt_tests PRIVATE K4_HOST_EMULATION)
target_link_libraries(k4_simt_tests PRIVATE k4_reference doctest::doctest Boost::context)
add_test(NAME k4_simt_tests COMMAND k4_simt_tests --no-colors=true)
set_tests_properties(k4_simt_tests PROPERTIES LABELS "emulation")
# ... and a planted bit in the fast up/gate's output must be caught there (K4_PLANT_FAST).
k4_emulation_variant(k4_emu_plant_fast DEFINES K4_PLANT_FAST=1)
add_test(NAME k4_emu_plant_fast COMMAND k4_emu_plant_fast "-tc=plant probe" --no-colors=true)
set_tests_properties(k4_emu_plant_fast PROPERTIES LABELS "emulation;tensor-core" ENVIRONMENT "${_k4_emu_fast_env}"
                     PASS_REGULAR_EXPRESSION "first mismatching stage: 5\n")
set(_k4_emu_stages "-ts=gpu_stages")
add_test(NAME k4_emu_tests/stages COMMAND k4_emu_tests ${_k4_emu_stages}
         "-tc=plant probe,sanitizer case,stage twins,adversarial,per-rank index scores,paths variants,router variants,pad rows out of the wide MoE,indexer context parallelism" --no-colors=true)
add_test(NAME k4_emu_tests/all-reduce COMMAND k4_emu_tests ${_k4_emu_stages} "-tc=all-reduce forms" --no-colors=true)
add_test(NAME k4_emu_tests/full-preset COMMAND k4_emu_tests ${_k4_emu_stages} "-tc=full preset" --no-colors=true)
add_test(NAME k4_emu_tests/golden COMMAND k4_emu_tests -ts=gpu_golden --no-colors=true)
set_tests_properties(k4_emu_tests/stages k4_emu_tests/all-reduce k4_emu_tests/full-preset k4_emu_tests/golden
                     PROPERTIES LABELS "emulation" ENVIRONMENT "${_k4_emu_env}")

# A planted one-bit error must be caught: K4_PLANT_STAGE=N makes stage N's kernel flip bit 0
# of one output element; the suite's plant probe must then fail naming stage N
# (-DK4_EMU_PLANTS="0;1;2;3;4;5" for every stage).
set(K4_EMU_PLANTS "4" CACHE STRING "Stages (a ;-list) whose planted-error emulation variant ctest checks")
foreach(_n IN LISTS K4_EMU_PLANTS)
  k4_emulation_variant(k4_emu_plant${_n} DEFINES K4_PLANT_STAGE=${_n})
  add_test(NAME k4_emu_plant${_n} COMMAND k4_emu_plant${_n} "-tc=plant probe" --no-colors=true)
  # passes when the output names the stage (a mismatch found there), whatever the exit code
  set_tests_properties(k4_emu_plant${_n} PROPERTIES LABELS "emulation" ENVIRONMENT "${_k4_emu_env}"
                       PASS_REGULAR_EXPRESSION "first mismatching stage: ${_n}\n")
endforeach()
