# Finds what xpipe::xpipe (and optionally xpipe::cuda) link against. Used by the build and by the
# installed package config, so both resolve dependencies the same way.
include(CMakeFindDependencyMacro)
# oneDNN through our own find module (FindOneDNN.cmake, beside this file, says why not its config).
set(_xpipe_saved_module_path "${CMAKE_MODULE_PATH}")
list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
find_dependency(OneDNN)          # Debian: libdnnl-dev (oneDNN; host GEMM)
set(CMAKE_MODULE_PATH "${_xpipe_saved_module_path}")
find_dependency(OpenMP)          # oneDNN's threading runtime; xpipe's host element loops
find_dependency(ZLIB)            # gzip'd IDX data files

set(XPIPE_CUDA_FOUND OFF)
if(NOT DEFINED XPIPE_ENABLE_CUDA OR XPIPE_ENABLE_CUDA)
  if(EXISTS /usr/local/cuda AND NOT DEFINED CUDAToolkit_ROOT)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  # CMake 3.25's FindCUDAToolkit marks CUDA::nvToolsExt deprecated without checking that the
  # target exists when the project's cmake_minimum_required is >= 3.25; CUDA 13 ships no
  # nvToolsExt (only the header-only nvtx3), so configure fails on a stock Debian 12. The check
  # reads CMAKE_MINIMUM_REQUIRED_VERSION only to decide that warning, so it is lowered around the
  # call and restored (policies are untouched).
  set(_xpipe_saved_min_version "${CMAKE_MINIMUM_REQUIRED_VERSION}")
  set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  find_package(CUDAToolkit QUIET)
  set(CMAKE_MINIMUM_REQUIRED_VERSION "${_xpipe_saved_min_version}")
  if(CUDAToolkit_FOUND)
    set(XPIPE_CUDA_FOUND ON)
  endif()
endif()

# MPI for xpipe::mpi (the MPI executor and links; Debian: libopenmpi-dev, openmpi-bin). Optional:
# without it xpipe::xpipe and everything CPU-only still configure and build.
set(XPIPE_MPI_FOUND OFF)
if(NOT DEFINED XPIPE_ENABLE_MPI OR XPIPE_ENABLE_MPI)
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(XPIPE_MPI_FOUND ON)
  endif()
endif()
