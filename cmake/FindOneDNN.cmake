# Finds oneDNN's header and library (Debian: libdnnl-dev) and defines OneDNN::dnnl.
#
# Why not oneDNN's own package config (find_package(dnnl CONFIG))? Debian builds oneDNN with the
# OpenCL GPU runtime, so its dnnl-config.cmake calls find_package(OpenCL REQUIRED), which needs the
# OpenCL headers of ocl-icd-opencl-dev: a package libdnnl-dev only recommends, so an install with
# --no-install-recommends (ours, and many users') fails at configure. xpipe uses only the CPU GEMM
# of the C API (dnnl_sgemm in oneapi/dnnl/dnnl.h), never the GPU engine, so it needs just the header and the
# library; the OpenCL loader libdnnl itself links against is a hard dependency of the runtime
# package and arrives with it. Finding the two files directly keeps both our build and every
# find_package(xpipe) consumer free of a dependency xpipe never uses.
include(FindPackageHandleStandardArgs)

find_path(OneDNN_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.h DOC "Directory holding oneapi/dnnl/dnnl.h")
find_library(OneDNN_LIBRARY NAMES dnnl DOC "oneDNN's library (libdnnl)")
if(OneDNN_INCLUDE_DIR AND EXISTS "${OneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${OneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _onednn_version_lines
       REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define DNNL_VERSION_${_part} ([0-9]+).*" "\\1" _onednn_${_part}
                         "${_onednn_version_lines}")
  endforeach()
  set(OneDNN_VERSION "${_onednn_MAJOR}.${_onednn_MINOR}.${_onednn_PATCH}")
endif()

find_package_handle_standard_args(OneDNN
  REQUIRED_VARS OneDNN_LIBRARY OneDNN_INCLUDE_DIR
  VERSION_VAR OneDNN_VERSION
  REASON_FAILURE_MESSAGE "install Debian's libdnnl-dev (scripts/setup.sh does), or set OneDNN_ROOT")
mark_as_advanced(OneDNN_INCLUDE_DIR OneDNN_LIBRARY)

if(OneDNN_FOUND AND NOT TARGET OneDNN::dnnl)
  add_library(OneDNN::dnnl UNKNOWN IMPORTED)
  set_target_properties(OneDNN::dnnl PROPERTIES
    IMPORTED_LOCATION "${OneDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${OneDNN_INCLUDE_DIR}")
endif()
