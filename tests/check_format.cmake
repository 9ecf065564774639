# The style.format test: every C++ and CUDA source file of the project matches the committed
# .clang-format. Prints each file that does not and the command that fixes them. Usage:
#   cmake -DCLANG_FORMAT=/usr/bin/clang-format -DSOURCE_DIR=<repo> -P check_format.cmake
# Exit 77 (CTest: skipped) when clang-format is missing or not version 14: another version
# formats some constructs differently, so its verdict would be noise.
if(NOT CLANG_FORMAT)
  message("style.format skipped: clang-format not found (scripts/setup.sh installs it)")
  cmake_language(EXIT 77)
endif()
execute_process(COMMAND ${CLANG_FORMAT} --version OUTPUT_VARIABLE version)
if(NOT version MATCHES "version 14\\.")
  message("style.format skipped: the house style is fixed with clang-format 14, found ${version}")
  cmake_language(EXIT 77)
endif()
file(GLOB_RECURSE sources RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/include/*.hpp ${SOURCE_DIR}/include/*.cuh
     ${SOURCE_DIR}/tests/*.cpp ${SOURCE_DIR}/tests/*.hpp ${SOURCE_DIR}/tests/*.cu
     ${SOURCE_DIR}/tools/*.cpp ${SOURCE_DIR}/tools/*.hpp
     ${SOURCE_DIR}/examples/*.cpp ${SOURCE_DIR}/examples/*.cu
     ${SOURCE_DIR}/benchmarks/*.cpp ${SOURCE_DIR}/benchmarks/*.cu ${SOURCE_DIR}/benchmarks/*.hpp)
set(unformatted)
foreach(f IN LISTS sources)
  execute_process(COMMAND ${CLANG_FORMAT} --style=file --dry-run --Werror ${f}
                  WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND unformatted ${f})
  endif()
endforeach()
list(LENGTH sources checked)
if(unformatted)
  list(JOIN unformatted "\n  " shown)
  message(FATAL_ERROR "not in the house style (.clang-format):\n  ${shown}\n"
                      "fix with: cmake --build --preset release --target format")
endif()
message(STATUS "style.format: ${checked} files match .clang-format")
