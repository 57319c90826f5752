# K4Install.cmake -- `cmake --install build --prefix P` and find_package(k4).
#
#   P/bin/k4, k4_kut                       the command line tools
#   P/lib/libk4_reference.a, libk4_golden.a   the model and the golden libraries
#   P/lib/k4/kut/libk4_kut_*.so            the kernel-under-test libraries (ours, the reference, the wrong merge)
#   P/include/k4/{reference,golden,device/kut}/...   their headers (#include "reference/model.hpp")
#   P/lib/cmake/k4/                        k4Config.cmake: targets k4::reference, k4::golden
#   P/lib/pkgconfig/k4.pc                  pkg-config --cflags --libs k4
#   P/lib/python3.X/site-packages/k4/     the Python package (PYTHONPATH, unless P's site dir is on sys.path)
#   P/share/doc/k4/                        README.md and docs/*.md
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

foreach(_t k4_reference k4_golden)
  target_include_directories(${_t} INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/k4>)
endforeach()
set_target_properties(k4_reference PROPERTIES EXPORT_NAME reference)
set_target_properties(k4_golden PROPERTIES EXPORT_NAME golden)
set_target_properties(k4_hdf5 PROPERTIES EXPORT_NAME hdf5)
set_target_properties(k4_openmp PROPERTIES EXPORT_NAME openmp)
if(NOT TARGET k4::reference)  # the same names for a parent project that add_subdirectory's this one
  add_library(k4::reference ALIAS k4_reference)
  add_library(k4::golden ALIAS k4_golden)
endif()

install(TARGETS k4_reference k4_golden k4_hdf5 k4_openmp EXPORT k4Targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT k4Targets NAMESPACE k4:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/k4)
file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/k4Config.cmake.in" [=[
@PACKAGE_INIT@
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(OpenMP COMPONENTS CXX)
find_dependency(Eigen3 3.3 NO_MODULE)
find_dependency(nlohmann_json 3)
find_dependency(HDF5 COMPONENTS C)
include("${CMAKE_CURRENT_LIST_DIR}/k4Targets.cmake")
check_required_components(k4)
]=])
configure_package_config_file("${CMAKE_CURRENT_BINARY_DIR}/k4Config.cmake.in" "${CMAKE_CURRENT_BINARY_DIR}/k4Config.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/k4)
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/k4ConfigVersion.cmake" VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/k4Config.cmake" "${CMAKE_CURRENT_BINARY_DIR}/k4ConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/k4)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/reference" "${PROJECT_SOURCE_DIR}/golden" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/k4
        FILES_MATCHING PATTERN "*.hpp")
install(FILES "${PROJECT_SOURCE_DIR}/device/kut/k4_kut.h" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/k4/device/kut)

foreach(_t k4 k4_kut)
  if(TARGET ${_t})
    install(TARGETS ${_t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
foreach(_t k4_kut_ours k4_kut_reference k4_kut_wrong_merge)
  if(TARGET ${_t})
    install(TARGETS ${_t} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/k4/kut)
  endif()
endforeach()

# pkg-config: the static libraries and what they link.
set(_k4_pc_libs "")
foreach(_l IN LISTS HDF5_C_LIBRARIES)
  string(APPEND _k4_pc_libs " ${_l}")
endforeach()
string(REPLACE ";" " " _k4_omp "${OpenMP_CXX_FLAGS}")
file(GENERATE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/k4.pc" CONTENT
"prefix=${CMAKE_INSTALL_PREFIX}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: k4
Description: bit-exact reference model of MiniMax-M3's K4 decode kernel, its golden files and tools
Version: ${PROJECT_VERSION}
Requires: eigen3 nlohmann_json
Cflags: -I\${includedir}/k4 -I${HDF5_C_INCLUDE_DIRS} ${_k4_omp} -std=c++17 -ffp-contract=off
Libs: -L\${libdir} -lk4_golden -lk4_reference${_k4_pc_libs} ${_k4_omp} -lpthread -ldl
")
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/k4.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(FILES "${PROJECT_SOURCE_DIR}/README.md" DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(GLOB _k4_docs "${PROJECT_SOURCE_DIR}/docs/*.md")
install(FILES ${_k4_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The installed tree used from another CMake project (find_package(k4): tests/package/consumer),
# from pkg-config and from Python: ctest package_install (labels cpu, package; it installs
# this build into build/package/prefix and compiles the consumer).
set(_pk "${CMAKE_BINARY_DIR}/package")
set(_pypath "")
if(K4_PYTHON AND TARGET k4_python)
  set(_pypath "${_pk}/prefix/${K4_PYTHON_INSTALL_DIR}")
endif()
add_test(NAME package_install COMMAND bash "${PROJECT_SOURCE_DIR}/tests/package/install_test.sh"
         "${CMAKE_COMMAND}" "${CMAKE_BINARY_DIR}" "${_pk}" "${PROJECT_SOURCE_DIR}/tests/package/consumer" "${Python_EXECUTABLE}" "${_pypath}")
set_tests_properties(package_install PROPERTIES LABELS "cpu;package")
# As a subproject: a parent project (tests/package/subproject) that add_subdirectory's this
# tree and links k4::golden configures and generates (the targets, aliases and options resolve).
add_test(NAME package_subproject COMMAND bash -c "rm -rf \"$1\" && \"$0\" -S \"$2\" -B \"$1\" -G Ninja -DK4_SOURCE_DIR=\"$3\" >/dev/null && ninja -C \"$1\" -n k4_consumer >/dev/null && echo subproject: ok"
         "${CMAKE_COMMAND}" "${CMAKE_BINARY_DIR}/package-subproject" "${PROJECT_SOURCE_DIR}/tests/package/subproject" "${PROJECT_SOURCE_DIR}")
set_tests_properties(package_subproject PROPERTIES LABELS "cpu;package" PASS_REGULAR_EXPRESSION "subproject: ok")
