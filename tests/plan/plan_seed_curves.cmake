# xpipe-plan plan with an E(B) file that lists each seed's epochs: the gain it reports under a
# seed's own curve must be the gain a plan given that curve alone reports. Seed 1 of
# efficiency-seeds.json is efficiency.json's curve, seed 2 efficiency-steep.json's; the mean
# curve (the file's points) is neither. Usage:
#   cmake -DPLAN=xpipe-plan -DDIR=tests/plan -P plan_seed_curves.cmake
set(common --model ${DIR}/model.json --cluster ${DIR}/cluster.json --batch-per-replica 32,128)
function(plan_output file var)
  execute_process(COMMAND ${PLAN} plan ${common} --efficiency ${DIR}/${file}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "plan --efficiency ${file}: exit ${rc}\n${out}${err}")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
# The hybrid gain on `devices` devices in the "best per device count" table.
function(table_gain out devices var)
  if(NOT out MATCHES "\n${devices} +[0-9]x1 [^\n]*\\| [^\n]* ([-+][0-9.]+%)\n")
    message(FATAL_ERROR "no hybrid gain for ${devices} devices in:\n${out}")
  endif()
  set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
plan_output(efficiency.json flat)
plan_output(efficiency-steep.json steep)
plan_output(efficiency-seeds.json seeds)
if(NOT seeds MATCHES "hybrid gain under each seed's own E\\(B\\) \\(2 seeds\\)")
  message(FATAL_ERROR "no per-seed table:\n${seeds}")
endif()
foreach(n 2 4)
  table_gain("${flat}" ${n} g1)
  table_gain("${steep}" ${n} g2)
  table_gain("${seeds}" ${n} gmean)
  string(REPLACE "+" "\\+" g1_re "${g1}")
  string(REPLACE "+" "\\+" g2_re "${g2}")
  if(NOT seeds MATCHES "\n${n} +[0-9] of 2 seeds +${g1_re} ${g2_re}\n")
    message(FATAL_ERROR "on ${n} devices seed 1 should gain ${g1} (efficiency.json alone) and "
                        "seed 2 ${g2} (efficiency-steep.json alone):\n${seeds}")
  endif()
  if(gmean STREQUAL g1 AND gmean STREQUAL g2)
    message(FATAL_ERROR "the mean curve gains what both seeds gain (${gmean}): the case checks nothing")
  endif()
  message(STATUS "${n} devices: seed 1 ${g1}, seed 2 ${g2}, mean curve ${gmean}")
endforeach()
