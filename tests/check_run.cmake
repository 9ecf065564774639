# Runs CMD (a ;-list) and checks its exit code against EXPECT_RC and its output (stdout and
# stderr together) against EXPECT_REGEX. Usage:
#   cmake -DCMD="prog;--flag" -DEXPECT_RC=2 -DEXPECT_REGEX="..." -P check_run.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}; output:\n${all}")
endif()
if(DEFINED EXPECT_REGEX AND NOT all MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match '${EXPECT_REGEX}':\n${all}")
endif()
message(STATUS "ok: exit ${rc}")
