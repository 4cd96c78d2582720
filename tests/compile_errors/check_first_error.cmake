# Compiles SOURCE (which must fail) and checks that its first "error:" line
# matches EXPECT: the mistake a user makes gets one readable message first,
# not a cascade from frugal's templates.
# -DCXX=... -DSOURCE=... -DINCLUDE=... -DEXPECT=regex [-DFORBID=regex]
separate_arguments(extra UNIX_COMMAND "${EXTRA_FLAGS}")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -fdiagnostics-color=never -I${INCLUDE} ${extra} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it holds a mistake that must not compile")
endif()
string(REGEX MATCH "[^\n]*error:[^\n]*" first "${err}")
if(NOT first MATCHES "${EXPECT}")
  message(FATAL_ERROR "the first error of ${SOURCE} is not the readable one.\nexpected it to match: ${EXPECT}\n"
                      "first error: ${first}\nwhole output:\n${err}")
endif()
if(FORBID AND err MATCHES "${FORBID}")
  message(FATAL_ERROR "${SOURCE}: the compiler output has a misleading line matching '${FORBID}':\n${err}")
endif()
message(STATUS "first error: ${first}")
