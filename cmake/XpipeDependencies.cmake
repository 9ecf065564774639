# Finds what xpipe::xpipe (and optionally xpipe::cuda) link against. Used by the build and by the
# installed package config, so both resolve dependencies the same way.
include(CMakeFindDependencyMacro)
find_dependency(dnnl CONFIG)     # Debian: libdnnl-dev (oneDNN; host GEMM)
find_dependency(OpenMP)          # oneDNN's threading runtime; xpipe's host element loops
find_dependency(ZLIB)            # gzip'd IDX data files

set(XPIPE_CUDA_FOUND OFF)
if(NOT DEFINED XPIPE_ENABLE_CUDA OR XPIPE_ENABLE_CUDA)
  if(EXISTS /usr/local/cuda AND NOT DEFINED CUDAToolkit_ROOT)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(XPIPE_CUDA_FOUND ON)
  endif()
endif()
