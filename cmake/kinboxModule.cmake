# kinbox_add_module(NAME SOURCES file... [OUTPUT_DIRECTORY dir])
#
# A handler module for `kinbox run`: NAME.so (no "lib" prefix), loaded as
# handler = NAME from handler.path. It is compiled with kinbox's headers
# and default-hidden symbols (export the descriptor with
# KINBOX_MODULE_EXPORT) and linked against nothing of kinbox: the kinbox
# command that dlopen()s it provides the public API (docs/modules.md).
# Shipped in the CMake package (find_package(kinbox)); the source tree
# builds examples/module with it too.
function(kinbox_add_module name)
  cmake_parse_arguments(PARSE_ARGV 1 _kbm "" "OUTPUT_DIRECTORY" "SOURCES")
  if(NOT _kbm_SOURCES)
    message(FATAL_ERROR "kinbox_add_module(${name}): no SOURCES")
  endif()
  if(TARGET kinbox::kinbox)
    set(_kbm_api kinbox::kinbox)
  else()
    set(_kbm_api kinbox) # kinbox's own source tree
  endif()
  add_library(${name} MODULE ${_kbm_SOURCES})
  target_include_directories(${name} PRIVATE
    $<TARGET_PROPERTY:${_kbm_api},INTERFACE_INCLUDE_DIRECTORIES>)
  set_target_properties(${name} PROPERTIES PREFIX "" SUFFIX ".so"
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden)
  if(_kbm_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY ${_kbm_OUTPUT_DIRECTORY})
  endif()
endfunction()
