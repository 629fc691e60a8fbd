# One CMake library per layer of src/ (docs/architecture.md, "Layers"). A layer may include and
# link only the layers it names in DEPS (and, transitively, theirs):
#   - each layer compiles against an include tree of its own (build/layers/<name>/) holding
#     links to exactly the source folders it may see, so an upward #include fails to compile;
#   - each layer is a shared library linked with --no-undefined, so an upward call (declared by
#     hand to dodge the include check) fails to link;
#   - scripts/check_layers.py checks every #include under src/ against the same table
#     (build/layers.json, written here), as the CTest test `layers.includes`.
# Layers register what they own (op extensions, backends, targets) from their own code.

set_property(GLOBAL PROPERTY KILN_LAYER_NAMES "")
set_property(GLOBAL PROPERTY KILN_LAYERS_JSON "")

# kiln_layer(NAME DIRS dir... [DEPS layer...] [LIBS lib...] [SOURCES extra...])
function(kiln_layer name)
  cmake_parse_arguments(L "" "" "DIRS;DEPS;LIBS" ${ARGN})
  set(srcs "")
  foreach(dir ${L_DIRS})
    file(GLOB_RECURSE dir_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${dir}/*.cc
         ${CMAKE_SOURCE_DIR}/src/${dir}/*.cu)
    list(APPEND srcs ${dir_srcs})
  endforeach()
  # Folders visible to this layer: its own and those of every layer below it.
  set(visible ${L_DIRS})
  set(closure "")
  foreach(dep ${L_DEPS})
    if(NOT TARGET kiln_${dep})
      message(FATAL_ERROR "layer '${name}' depends on '${dep}', which is not defined before it")
    endif()
    get_property(dep_dirs GLOBAL PROPERTY KILN_LAYER_VISIBLE_${dep})
    get_property(dep_closure GLOBAL PROPERTY KILN_LAYER_CLOSURE_${dep})
    list(APPEND visible ${dep_dirs})
    list(APPEND closure ${dep} ${dep_closure})
  endforeach()
  list(REMOVE_DUPLICATES visible)
  list(REMOVE_DUPLICATES closure)
  set_property(GLOBAL PROPERTY KILN_LAYER_VISIBLE_${name} ${visible})
  set_property(GLOBAL PROPERTY KILN_LAYER_CLOSURE_${name} ${closure})

  set(tree ${CMAKE_BINARY_DIR}/layers/${name})
  file(REMOVE_RECURSE ${tree})
  foreach(dir ${visible})
    get_filename_component(parent ${tree}/${dir} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${dir} ${tree}/${dir} SYMBOLIC)
  endforeach()

  add_library(kiln_${name} SHARED ${srcs})
  target_include_directories(kiln_${name} PRIVATE ${tree})
  foreach(dep ${L_DEPS})
    target_link_libraries(kiln_${name} PUBLIC kiln_${dep})
  endforeach()
  if(L_LIBS)
    target_link_libraries(kiln_${name} PRIVATE ${L_LIBS})
  endif()
  target_link_options(kiln_${name} PRIVATE -Wl,--no-undefined)
  set_target_properties(kiln_${name} PROPERTIES OUTPUT_NAME kiln_${name}
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
  set_property(GLOBAL APPEND PROPERTY KILN_LAYER_NAMES ${name})

  # The table for scripts/check_layers.py.
  set(dirs_json "")
  foreach(d ${L_DIRS})
    list(APPEND dirs_json "\"${d}\"")
  endforeach()
  set(deps_json "")
  foreach(d ${closure})
    list(APPEND deps_json "\"${d}\"")
  endforeach()
  list(JOIN dirs_json ", " dirs_json)
  list(JOIN deps_json ", " deps_json)
  set_property(GLOBAL APPEND_STRING PROPERTY KILN_LAYERS_JSON
               "    \"${name}\": {\"dirs\": [${dirs_json}], \"may_use\": [${deps_json}]},\n")
endfunction()

function(kiln_write_layers_json)
  get_property(json GLOBAL PROPERTY KILN_LAYERS_JSON)
  string(REGEX REPLACE ",\n$" "\n" body "${json}")
  file(WRITE ${CMAKE_BINARY_DIR}/layers.json "{\n  \"layers\": {\n${body}  }\n}\n")
endfunction()
