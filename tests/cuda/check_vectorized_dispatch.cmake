# The cuda.vectorized_dispatch test: the object of vectorized_dispatch.cu (optimizer steps and
# predictions on a CudaContext) must hold the vectorised kernel of every pass it instantiates,
# i.e. backend/cuda/loops.cuh took the quad form each pass declares (kernels/ops.hpp). No GPU.
#   cmake -DNM=<nm> -DOBJECTS=<objects;...> -P check_vectorized_dispatch.cmake
set(symbols)
foreach(o IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C ${o} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} -C ${o} failed (${rc})")
  endif()
  string(APPEND symbols "${out}")
endforeach()
set(missing)
foreach(op AdamStep AdamPredict AdamDirection SgdStep SgdPredict NadamStep)
  if(NOT symbols MATCHES "xpipe::cuda_vec::vectorized_kernel<xpipe::ops::${op}>")
    list(APPEND missing ${op})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "no vectorised kernel for: ${missing} (for_each_index on a CudaContext "
                      "did not take their quad form: backend/cuda/loops.cuh, cuda_vec::HasQuads)")
endif()
message(STATUS "cuda.vectorized_dispatch: every optimizer pass runs the vectorised kernel")
