# The configure switches do what the README says (issue 14):
#  1. -DBUILD_TESTING=OFF leaves the tests out (FRUGAL_BUILD_TESTS off);
#  2. with every FRUGAL_BUILD_* switch off, CUDA stays off and nvcc is not
#     even looked for, even where one is installed;
#  3. installing needs no build: `cmake --install` right after that
#     configure lays out the headers and the package files.
# -DSOURCE_DIR=... -DWORK_DIR=...
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()
# Fails unless the cache of `build` has `key` off (or unset), saying `why`.
function(expect_off build key why)
  file(STRINGS ${build}/CMakeCache.txt line REGEX "^${key}:")
  string(REGEX REPLACE "^[^=]*=" "" value "${line}")
  if(value)
    message(FATAL_ERROR "${why}: ${key}=${value}")
  endif()
endfunction()

# 1. BUILD_TESTING=OFF, nothing else said.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/no-testing -DBUILD_TESTING=OFF -DFRUGAL_BUILD_SAMPLES=OFF
    -DFRUGAL_BUILD_TOOLS=OFF -DFRUGAL_BUILD_BENCH=OFF)
expect_off(${WORK_DIR}/no-testing FRUGAL_BUILD_TESTS "-DBUILD_TESTING=OFF left the tests on")

# 2. Every switch off: no CUDA, no nvcc looked for.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/all-off -DFRUGAL_BUILD_TESTS=OFF -DFRUGAL_BUILD_SAMPLES=OFF
    -DFRUGAL_BUILD_TOOLS=OFF -DFRUGAL_BUILD_BENCH=OFF)
expect_off(${WORK_DIR}/all-off FRUGAL_WITH_CUDA "with every FRUGAL_BUILD_* switch off, CUDA is on")
# check_language(CUDA) says "Looking for a CUDA compiler"; enable_language
# leaves a CMakeCUDACompiler.cmake.
file(GLOB_RECURSE cuda_files ${WORK_DIR}/all-off/CMakeFiles/*CUDA*)
if(run_output MATCHES "CUDA" OR cuda_files)
  message(FATAL_ERROR "with every FRUGAL_BUILD_* switch off, the configure still looked at CUDA:\n${run_output}\n${cuda_files}")
endif()

# 3. Install straight after the configure: no build step.
run(${CMAKE_COMMAND} --install ${WORK_DIR}/all-off --prefix ${WORK_DIR}/prefix)
file(GLOB_RECURSE config ${WORK_DIR}/prefix/*/frugalConfig.cmake)
foreach(f ${WORK_DIR}/prefix/include/frugal/frugal.hpp ${WORK_DIR}/prefix/include/frugal/kernels.hpp ${config})
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "installing without a build did not install ${f}")
  endif()
endforeach()
if(NOT config)
  message(FATAL_ERROR "installing without a build did not install frugalConfig.cmake")
endif()
message(STATUS "BUILD_TESTING=OFF honoured; CUDA off with the switches off; installed without a build")
