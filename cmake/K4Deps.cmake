# K4Deps.cmake -- the third-party packages, as interface targets the project links:
#
#   k4::hdf5    HDF5 (C API): shared by default; with K4_STATIC_RUNTIME the static archives
#               libhdf5.a + libsz.a + libaec.a + libz.a (the GPU machine has no HDF5)
#   k4::openmp  OpenMP for C++: gcc's libgomp; static libgomp.a with K4_STATIC_RUNTIME
#   Eigen3::Eigen, doctest::doctest, nlohmann_json::nlohmann_json, CLI11::CLI11 (header-only)

find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(doctest REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(HDF5 REQUIRED COMPONENTS C)

# ------------------------------------------------------------------------------------- HDF5
add_library(k4_hdf5 INTERFACE)
add_library(k4::hdf5 ALIAS k4_hdf5)
target_include_directories(k4_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
if(HDF5_C_DEFINITIONS)
  target_compile_definitions(k4_hdf5 INTERFACE ${HDF5_C_DEFINITIONS})
endif()

if(K4_STATIC_RUNTIME)
  set(_k4_hdf5_hints "")
  foreach(_lib IN LISTS HDF5_C_LIBRARIES HDF5_LIBRARIES)
    if(EXISTS "${_lib}")
      get_filename_component(_dir "${_lib}" DIRECTORY)
      list(APPEND _k4_hdf5_hints "${_dir}")
    endif()
  endforeach()
  list(APPEND _k4_hdf5_hints /usr/lib/x86_64-linux-gnu/hdf5/serial /usr/lib/x86_64-linux-gnu)
  list(REMOVE_DUPLICATES _k4_hdf5_hints)
  set(_k4_static_libs "")
  foreach(_name hdf5 sz aec z)
    find_library(K4_STATIC_LIB_${_name} NAMES lib${_name}.a HINTS ${_k4_hdf5_hints} NO_CMAKE_SYSTEM_PATH)
    if(NOT K4_STATIC_LIB_${_name})
      find_library(K4_STATIC_LIB_${_name} NAMES lib${_name}.a)
    endif()
    if(NOT K4_STATIC_LIB_${_name})
      message(FATAL_ERROR "K4_STATIC_RUNTIME: lib${_name}.a not found (apt-get install libhdf5-dev libaec-dev zlib1g-dev)")
    endif()
    list(APPEND _k4_static_libs "${K4_STATIC_LIB_${_name}}")
  endforeach()
  target_link_libraries(k4_hdf5 INTERFACE ${_k4_static_libs} ${CMAKE_DL_LIBS} m Threads::Threads)
  message(STATUS "k4: HDF5 linked statically: ${_k4_static_libs}")
else()
  target_link_libraries(k4_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
endif()

# ----------------------------------------------------------------------------------- OpenMP
add_library(k4_openmp INTERFACE)
add_library(k4::openmp ALIAS k4_openmp)
if(K4_STATIC_RUNTIME)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libgomp.a
                  OUTPUT_VARIABLE K4_LIBGOMP_A OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${K4_LIBGOMP_A}" OR NOT EXISTS "${K4_LIBGOMP_A}")
    message(FATAL_ERROR "K4_STATIC_RUNTIME: libgomp.a not found (${CMAKE_CXX_COMPILER} -print-file-name=libgomp.a)")
  endif()
  separate_arguments(_k4_omp_flags NATIVE_COMMAND "${OpenMP_CXX_FLAGS}")
  target_compile_options(k4_openmp INTERFACE "$<$<COMPILE_LANGUAGE:CXX>:${_k4_omp_flags}>")
  # A shared object cannot take libgomp.a (its TLS model is local-exec): a target that sets
  # K4_SHARED_LIBGOMP links libgomp.so.1 itself instead (device/kut's device libraries).
  target_link_libraries(k4_openmp INTERFACE "$<$<NOT:$<BOOL:$<TARGET_PROPERTY:K4_SHARED_LIBGOMP>>>:${K4_LIBGOMP_A}>"
                        Threads::Threads ${CMAKE_DL_LIBS})
  message(STATUS "k4: OpenMP linked statically: ${K4_LIBGOMP_A}")
else()
  target_link_libraries(k4_openmp INTERFACE OpenMP::OpenMP_CXX)
endif()
