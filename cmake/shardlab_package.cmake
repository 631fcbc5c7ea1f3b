# The installable CMake package: `cmake --install build --prefix P` puts the
# headers under P/include with the paths the code uses ("runtime/cluster.h"),
# the libraries under P/lib, and P/lib/cmake/shardlab, so that an outside
# project's find_package(shardlab) gives imported targets with their
# dependencies:
#
#   shardlab::runtime      Cluster, Device, links, profiles (runtime/)
#   shardlab::collectives  ProcessGroup, DeviceMesh, the collectives (collectives/)
#   shardlab::model        the GPT, kernels, AdamW (model/)
#   shardlab::model_io     token data, safetensors (model/io/)
#   shardlab::parallel     the sharded model, DP/ZeRO, pipelines (model/parallel/)
#   shardlab::engine       what train, infer and serve share: DeviceSink, shard I/O,
#                          the model's JSON (model/engine/)
#   shardlab::train        train(), verify (model/train/)
#   shardlab::sweep        the sweep's grid, CSV, plots (model/sweep/)
#   shardlab::infer        the inference engine, generate() (model/infer/)
#   shardlab::shardlab     all of the above
#
# The same names exist as aliases inside this build, so an example's
# CMakeLists.txt reads the same in the tree and outside it (examples/hello_cluster).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SHARDLAB_PACKAGE_LIBS runtime collectives model model_io parallel engine train sweep infer)
set(shardlab_installed "")
foreach(name ${SHARDLAB_PACKAGE_LIBS})
  if(TARGET shardlab_${name})  # SHARDLAB_COMPONENTS may leave some out
    set_target_properties(shardlab_${name} PROPERTIES EXPORT_NAME ${name})
    add_library(shardlab::${name} ALIAS shardlab_${name})
    list(APPEND shardlab_installed shardlab_${name})
  endif()
endforeach()
# Consumers compile the headers as C++20 too.
set_property(TARGET shardlab_runtime APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)

add_library(shardlab_all INTERFACE)
set_target_properties(shardlab_all PROPERTIES EXPORT_NAME shardlab)
target_link_libraries(shardlab_all INTERFACE ${shardlab_installed})
add_library(shardlab::shardlab ALIAS shardlab_all)

install(TARGETS ${shardlab_installed} shardlab_all EXPORT shardlabTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(dir runtime collectives model)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir}/CMakeLists.txt AND (dir STREQUAL "runtime" OR dir IN_LIST SHARDLAB_COMPONENTS))
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
            FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()

set(shardlab_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/shardlab)
install(EXPORT shardlabTargets NAMESPACE shardlab:: DESTINATION ${shardlab_config_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/shardlabConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/shardlabConfig.cmake
                              INSTALL_DESTINATION ${shardlab_config_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/shardlabConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shardlabConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/shardlabConfigVersion.cmake
        DESTINATION ${shardlab_config_dir})
