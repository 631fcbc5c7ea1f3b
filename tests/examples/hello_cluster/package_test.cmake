# The installed package as a user meets it: install this build into a fresh
# prefix, configure examples/hello_cluster as an outside project with only
# that prefix to find shardlab in, build it, run it. Every step must succeed,
# find_package must have used the installed package, and hello_cluster must
# pass its own checks.
#
# cmake -DBUILD_DIR=... -DEXAMPLE_DIR=... -DWORK_DIR=... -DCXX=... [-DLAUNCHER=...]
#       [-DBUILD_TYPE=...] [-DSAN_FLAGS=...] -P package_test.cmake
foreach(var BUILD_DIR EXAMPLE_DIR WORK_DIR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "package_test.cmake: -D${var}=... is required")
  endif()
endforeach()

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${what} failed (${code}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(file include/runtime/cluster.h include/collectives/collectives.h include/model/gpt.h
             lib/cmake/shardlab/shardlabConfig.cmake)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "the install has no ${file}")
  endif()
endforeach()

step("configuring hello_cluster against the package" ${CMAKE_COMMAND} -S ${EXAMPLE_DIR} -B ${build}
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
     -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}
     -DCMAKE_BUILD_TYPE=${BUILD_TYPE} "-DCMAKE_CXX_FLAGS=${SAN_FLAGS}"
     "-DCMAKE_EXE_LINKER_FLAGS=${SAN_FLAGS}")
file(STRINGS ${build}/CMakeCache.txt found REGEX "^shardlab_DIR:")
if(NOT found MATCHES "^shardlab_DIR:PATH=${prefix}/")
  message(FATAL_ERROR "find_package(shardlab) did not use the installed package: ${found}")
endif()

step("building hello_cluster" ${CMAKE_COMMAND} --build ${build} -j 2)
step("running hello_cluster" ${build}/hello_cluster)
if(NOT step_output MATCHES "\nPASS: ")
  message(FATAL_ERROR "hello_cluster did not print PASS:\n${step_output}")
endif()
message(STATUS "hello_cluster built against ${prefix} and passed:\n${step_output}")
