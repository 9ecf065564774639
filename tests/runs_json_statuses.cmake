# Prints "<run count> <status> <status> ..." of an xpipe-train runs.json (e.g. "2 ok interrupted"),
# read by CMake's JSON parser, so the file must parse. Usage: cmake -DFILE=runs.json -P this
file(READ "${FILE}" text)
string(JSON n LENGTH "${text}")
set(out "${n}")
if(n GREATER 0)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON s GET "${text}" ${i} status)
    string(APPEND out " ${s}")
  endforeach()
endif()
message("${out}")
