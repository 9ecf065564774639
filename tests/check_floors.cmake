# The style.include_floors test: a header under include/xpipe/<folder>/ includes only headers of
# its own floor or lower ones (docs/layout.md, "Floors"). Prints every include that reaches up.
#   cmake -DSOURCE_DIR=<repo> -P check_floors.cmake
# floor_of(folder out): the floor's rank, lowest 0; -1 for a folder with no floor.
function(floor_of folder out)
  set(rank -1)
  set(i 0)
  foreach(group "core" "backend|schedule|data|checkpoint" "kernels" "layers|optim" "predict"
                "comm|exec|sim|trace" "pipeline" "models")
    if(folder MATCHES "^(${group})$")
      set(rank ${i})
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} ${rank} PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE ${SOURCE_DIR}/include/xpipe
     ${SOURCE_DIR}/include/xpipe/*/*.hpp ${SOURCE_DIR}/include/xpipe/*/*.cuh)
set(violations)
set(edges 0)
foreach(h IN LISTS headers)
  string(REGEX MATCH "^[^/]+" folder "${h}")
  floor_of(${folder} own)
  if(own EQUAL -1)
    list(APPEND violations "${h}: folder '${folder}' has no floor (add it to check_floors.cmake)")
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/include/xpipe/${h} lines REGEX "^#include \"xpipe/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"xpipe/([^/\"]+)/" _ "${line}")
    if(NOT CMAKE_MATCH_1)
      continue()  # an umbrella header
    endif()
    floor_of(${CMAKE_MATCH_1} theirs)
    math(EXPR edges "${edges} + 1")
    if(theirs GREATER own)
      list(APPEND violations "${h} (floor ${own}) ${line} (floor ${theirs})")
    endif()
  endforeach()
endforeach()
if(violations)
  list(JOIN violations "\n  " shown)
  message(FATAL_ERROR "includes that reach up a floor (core < backend, schedule, data, checkpoint < kernels "
                      "< layers, optim < predict < comm, exec, sim, trace < pipeline < models):\n  ${shown}")
endif()
list(LENGTH headers n)
message(STATUS "style.include_floors: ${edges} includes in ${n} headers, none reaches up")
