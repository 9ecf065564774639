# The docs.layout test: docs/layout.md has a heading for every folder under include/xpipe/ and
# for no folder that is gone. A heading counts when it starts with the folder's path in
# backticks, ending in a slash: "## `include/xpipe/kernels/cuda/`" (any heading level).
#   cmake -DSOURCE_DIR=<repo> -P check_layout.cmake
cmake_minimum_required(VERSION 3.25)  # script mode: the policies of the project's CMake (IN_LIST)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "docs.layout: pass -DSOURCE_DIR=<repository root>")
endif()
set(page ${SOURCE_DIR}/docs/layout.md)
if(NOT EXISTS ${page})
  message(FATAL_ERROR "docs.layout: ${page} is missing")
endif()

# The folders, as include/xpipe/<folder>/ (nested ones too: include/xpipe/kernels/cuda/).
file(GLOB_RECURSE entries LIST_DIRECTORIES true RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/include/xpipe/*)
set(folders)
foreach(e IN LISTS entries)
  if(IS_DIRECTORY ${SOURCE_DIR}/${e})
    list(APPEND folders "${e}/")
  endif()
endforeach()
list(SORT folders)

# The folders the page has a heading for.
file(STRINGS ${page} headings REGEX "^#+ `include/xpipe/[^`]*/`")
set(documented)
foreach(h IN LISTS headings)
  string(REGEX MATCH "`(include/xpipe/[^`]*/)`" _ "${h}")
  list(APPEND documented "${CMAKE_MATCH_1}")
endforeach()

set(missing)
foreach(f IN LISTS folders)
  if(NOT f IN_LIST documented)
    list(APPEND missing "${f}")
  endif()
endforeach()
set(stale)
foreach(d IN LISTS documented)
  if(NOT d IN_LIST folders)
    list(APPEND stale "${d}")
  endif()
endforeach()

set(problems)
if(missing)
  list(JOIN missing "\n  " shown)
  string(APPEND problems "folders without a heading in docs/layout.md (add \"## `<folder>`\"):\n"
         "  ${shown}\n")
endif()
if(stale)
  list(JOIN stale "\n  " shown)
  string(APPEND problems "headings in docs/layout.md for folders that do not exist:\n  ${shown}\n")
endif()
if(problems)
  message(FATAL_ERROR "${problems}")
endif()
list(LENGTH folders n)
message(STATUS "docs.layout: all ${n} folders under include/xpipe/ have a heading in docs/layout.md")
