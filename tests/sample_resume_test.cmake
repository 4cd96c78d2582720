# Interrupt-and-resume is bitwise: a run of N steps, and a run stopped after
# K steps then resumed from its checkpoint to N, end with byte-identical
# checkpoints (weights, optimizer state, step counter, and the whole loss
# history) and the same final loss. Then a truncated and a corrupted copy of
# the checkpoint must each be refused with an error naming the file.
# EXE: the sample; ARGS: its arguments (a ;-list, including --steps N);
# STOP: K; WORK_DIR: scratch directory.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run_sample out_var)
  execute_process(COMMAND ${EXE} ${ARGS} --json ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} ${ARGN} exited ${rc}\n${out}\n${err}")
  endif()
  string(STRIP "${out}" out)
  string(REGEX REPLACE ".*\n" "" last "${out}")
  set(${out_var} "${last}" PARENT_SCOPE)
endfunction()

run_sample(straight --checkpoint ${WORK_DIR}/straight.safetensors)
run_sample(first_part --checkpoint ${WORK_DIR}/part.safetensors --stop-after ${STOP})
string(JSON stopped GET "${first_part}" steps)
if(NOT stopped EQUAL STOP)
  message(FATAL_ERROR "the interrupted run should have stopped after ${STOP} steps, not ${stopped}")
endif()
run_sample(resumed --resume ${WORK_DIR}/part.safetensors --checkpoint ${WORK_DIR}/resumed.safetensors)
string(JSON from GET "${resumed}" resumed_from)
if(NOT from EQUAL STOP)
  message(FATAL_ERROR "the resumed run should start at step ${STOP}, not ${from}")
endif()
string(JSON a GET "${straight}" final_loss)
string(JSON b GET "${resumed}" final_loss)
message("final loss: straight ${a}, resumed ${b}")
if(NOT a STREQUAL b)
  message(FATAL_ERROR "the resumed run ends at loss ${b}, the uninterrupted run at ${a}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/straight.safetensors ${WORK_DIR}/resumed.safetensors
                RESULT_VARIABLE differ)
if(differ)
  message(FATAL_ERROR "the final checkpoints of the straight and the resumed run differ")
endif()

# Damaged checkpoints: cut in half, and with garbage over the start of the
# header. Each must fail with a message naming the file.
file(SIZE ${WORK_DIR}/part.safetensors size)
math(EXPR half "${size} / 2")
execute_process(COMMAND head -c ${half} ${WORK_DIR}/part.safetensors OUTPUT_FILE ${WORK_DIR}/truncated.safetensors)
file(COPY_FILE ${WORK_DIR}/part.safetensors ${WORK_DIR}/corrupt.safetensors)
execute_process(COMMAND sh -c "printf 'garbage!garbage!' | dd of=${WORK_DIR}/corrupt.safetensors bs=1 seek=8 conv=notrunc 2>/dev/null")
foreach(kind truncated corrupt)
  set(path ${WORK_DIR}/${kind}.safetensors)
  execute_process(COMMAND ${EXE} ${ARGS} --json --resume ${path} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "resuming from a ${kind} checkpoint succeeded:\n${out}")
  endif()
  string(FIND "${err}" "${path}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the error for a ${kind} checkpoint does not name ${path}: ${err}")
  endif()
  message("${kind}: ${err}")
endforeach()
