# Resharding a checkpoint: SAVE (mpirun -np 4 dist_test reshard-save DIR)
# trains and writes a gathered checkpoint and its later losses into DIR;
# LOAD (mpirun -np 2 dist_test reshard-load DIR) resumes from it and checks
# the losses. Both must succeed.
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
foreach(phase SAVE LOAD)
  execute_process(COMMAND ${${phase}} ${DIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  message("${out}\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the ${phase} job ended with status ${rc}")
  endif()
endforeach()
file(REMOVE_RECURSE ${DIR})
