# Runs a sample twice with --json, unconstrained and under a budget, and
# checks that the budget bound (the plan recomputed or swapped something,
# the measured peak within the cap) and changed no result: the planner never
# changes a bit, so the losses print the same digits.
# EXE: the sample; ARGS: its arguments (a ;-list); BUDGET: the --budget value;
# KEYS: the JSON keys that must be equal in both runs.
function(run_json out_var)
  execute_process(COMMAND ${EXE} ${ARGN} --json RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} ${ARGN} exited ${rc}\n${out}\n${err}")
  endif()
  string(STRIP "${out}" out)
  string(REGEX REPLACE ".*\n" "" last "${out}")
  message("json: ${last}")
  set(${out_var} "${last}" PARENT_SCOPE)
endfunction()

run_json(free ${ARGS})
run_json(tight ${ARGS} --budget ${BUDGET})
foreach(key ${KEYS})
  string(JSON a GET "${free}" ${key})
  string(JSON b GET "${tight}" ${key})
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${key} differs: ${a} unconstrained, ${b} under --budget ${BUDGET}")
  endif()
endforeach()
string(JSON peak GET "${tight}" peak_device_bytes)
string(JSON budget GET "${tight}" budget_bytes)
string(JSON unconstrained GET "${tight}" unconstrained_bytes)
string(JSON recomputed GET "${tight}" recomputed)
string(JSON swapped GET "${tight}" swapped_to_host)
if(budget LESS_EQUAL 0 OR peak GREATER budget)
  message(FATAL_ERROR "device peak ${peak} bytes is over the budget of ${budget}")
endif()
if(NOT budget LESS unconstrained OR (recomputed EQUAL 0 AND swapped EQUAL 0))
  message(FATAL_ERROR "the budget ${budget} (unconstrained ${unconstrained}) did not bind: nothing was tested")
endif()
message("same ${KEYS} under --budget ${BUDGET}: peak ${peak} of ${budget} (unconstrained ${unconstrained}); ${recomputed} recomputed, ${swapped} swapped")
