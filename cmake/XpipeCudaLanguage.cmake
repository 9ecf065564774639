# Enables CUDA in the calling directory (the tools, the CUDA tests and the GPU benchmarks) with
# the toolkit's nvcc and xpipe's default architectures, and sets `xpipe_cuda_arch_options`: the
# nvcc flags (for CUDA units only) a target of that directory adds for those defaults.
#
# Default (CMAKE_CUDA_ARCHITECTURES not set): machine code for sm_80 (A100) and sm_90 (H100, H200)
# and PTX for compute_80 (any later GPU), all from one compute_80 device pass. CMake's
# architecture list would run nvcc's device front end once per architecture, a sixth of a CUDA
# unit's compile time each (17 s of test_cuda_pipeline.cu's 100 s on a 2-core AVX2 EPYC); the
# kernels use nothing newer than sm_80. Setting CMAKE_CUDA_ARCHITECTURES (scripts/gpu-bundle.sh
# does: 90) builds exactly the architectures named instead.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS ${CUDAToolkit_BIN_DIR}/nvcc)
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_BIN_DIR}/nvcc)
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  set(xpipe_cuda_arch_options
      "$<$<COMPILE_LANGUAGE:CUDA>:--generate-code=arch=compute_80$<COMMA>code=[compute_80$<COMMA>sm_80$<COMMA>sm_90]>")
else()
  set(xpipe_cuda_arch_options "")
endif()
enable_language(CUDA)
