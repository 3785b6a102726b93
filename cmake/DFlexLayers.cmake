# The layers of the house: every library of lib/ and every area of runtime/
# is a layer, and what it builds on is what its target links. A build step
# (scripts/check_layers.py) refuses any include of a header from a layer
# that the includer does not build on, directly or through the layers below
# it (docs/design.md, "Layers"). Tests and tools sit above everything.

# dflex_layer(TARGET HEADERS <include prefix> DIRS <source dirs...>): the
# target's sources lie under DIRS and its headers under include/<prefix> or
# runtime/include/<prefix>.
function(dflex_layer target)
  cmake_parse_arguments(LAYER "" "HEADERS" "DIRS" ${ARGN})
  string(REPLACE ";" "," dirs "${LAYER_DIRS}")
  set_property(GLOBAL APPEND PROPERTY DFLEX_LAYERS "${target} ${LAYER_HEADERS} ${dirs}")
endfunction()

# Writes the layers with the layers each links, and checks every include on
# each build. Call once, after every layer's target exists.
function(dflex_check_layers)
  get_property(layers GLOBAL PROPERTY DFLEX_LAYERS)
  set(names)
  foreach(layer ${layers})
    string(REPLACE " " ";" fields "${layer}")
    list(GET fields 0 target)
    list(APPEND names ${target})
  endforeach()
  set(lines "")
  foreach(layer ${layers})
    string(REPLACE " " ";" fields "${layer}")
    list(GET fields 0 target)
    get_target_property(links ${target} LINK_LIBRARIES)
    get_target_property(interface_links ${target} INTERFACE_LINK_LIBRARIES)
    set(below)
    foreach(link ${links} ${interface_links})
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" link "${link}")
      if(link IN_LIST names AND NOT link STREQUAL target)
        list(APPEND below ${link})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES below)
    string(REPLACE ";" "," below "${below}")
    if(below STREQUAL "")
      set(below -)
    endif()
    string(APPEND lines "${layer} ${below}\n")
  endforeach()
  set(layer_file ${CMAKE_BINARY_DIR}/dflex-layers.txt)
  file(WRITE ${layer_file} "${lines}")
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS
    ${DFLEX_SOURCE_DIR}/lib/*.cpp ${DFLEX_SOURCE_DIR}/lib/*.h ${DFLEX_SOURCE_DIR}/include/*.h
    ${DFLEX_SOURCE_DIR}/runtime/*.cpp ${DFLEX_SOURCE_DIR}/runtime/*.h)
  add_custom_command(
    OUTPUT ${CMAKE_BINARY_DIR}/dflex-layers.checked
    COMMAND ${Python3_EXECUTABLE} ${DFLEX_SOURCE_DIR}/scripts/check_layers.py
            --root ${DFLEX_SOURCE_DIR} --layers ${layer_file}
    COMMAND ${CMAKE_COMMAND} -E touch ${CMAKE_BINARY_DIR}/dflex-layers.checked
    DEPENDS ${DFLEX_SOURCE_DIR}/scripts/check_layers.py ${layer_file} ${sources}
    COMMENT "Checking that no file includes a header of a layer it does not build on")
  add_custom_target(dflex_check_layers ALL DEPENDS ${CMAKE_BINARY_DIR}/dflex-layers.checked)
endfunction()
