# The gpt sample under mpirun (LAUNCH: mpirun ... -np 2 gpt, ARGS: its
# options): at ZeRO stages 0 and 3 it must end at the same training and
# validation losses, digit for digit (the stages train the same bits); a
# checkpoint it saves at 2 ranks and stage 3 must resume in one process
# (ONE: the gpt binary).
function(run_json out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  string(REGEX MATCH "\"final_loss\":[^,]*,.*\"val_loss\":[^,]*" losses "${out}")
  if(losses STREQUAL "")
    message(FATAL_ERROR "no losses in the JSON line of ${ARGN}:\n${out}")
  endif()
  string(REGEX MATCH "\"final_loss\":[^,]*" final "${out}")
  string(REGEX MATCH "\"val_loss\":[^,]*" val "${out}")
  set(${out_var} "${final} ${val}" PARENT_SCOPE)
  set(${out_var}_json "${out}" PARENT_SCOPE)
endfunction()
run_json(stage0 ${LAUNCH} ${ARGS} --zero 0 --json)
run_json(stage3 ${LAUNCH} ${ARGS} --zero 3 --json)
message("stage 0: ${stage0}\nstage 3: ${stage3}")
if(NOT stage0 STREQUAL stage3)
  message(FATAL_ERROR "ZeRO stages 0 and 3 of the gpt sample ended at different losses")
endif()
# Interrupted half way at stage 3, then resumed in one process.
run_json(half ${LAUNCH} ${ARGS} --zero 3 --json --stop-after 10 --checkpoint ${DIR}/gpt.ck)
run_json(resumed ${ONE} ${ARGS} --resume ${DIR}/gpt.ck --json)
message("resumed in one process: ${resumed}")
if(NOT resumed_json MATCHES "\"resumed_from\":10[,}]")
  message(FATAL_ERROR "the one-process run did not resume from step 10:\n${resumed_json}")
endif()
file(REMOVE ${DIR}/gpt.ck)
