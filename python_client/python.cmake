# Python client: the pybind11 extension hsdp._hsdp and the pure-Python package
# `hsdp`, assembled in ${CMAKE_BINARY_DIR}/python/hsdp so that
#   PYTHONPATH=build/python /usr/bin/python3 -c 'import hsdp'
# works after a build. The extension never links libtorch: one build serves
# every torch version installed for that interpreter.

# The wheel's build (python_client/pyproject.toml) builds for the interpreter
# scikit-build-core runs under (it sets Python_EXECUTABLE).
if(SKBUILD AND Python_EXECUTABLE)
  set(hsdp_default_python ${Python_EXECUTABLE})
else()
  set(hsdp_default_python /usr/bin/python3)
endif()
set(HSDP_PYTHON_EXECUTABLE ${hsdp_default_python} CACHE FILEPATH
    "Python interpreter the hsdp extension is built for")
set(HSDP_PYTHON_OUT ${CMAKE_BINARY_DIR}/python)

execute_process(
  COMMAND ${HSDP_PYTHON_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
  OUTPUT_VARIABLE HSDP_PYBIND11_DIR
  OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE HSDP_PYBIND11_RC
  ERROR_QUIET)
if(NOT HSDP_PYBIND11_RC EQUAL 0)
  message(WARNING "hsdpd: pybind11 not importable by ${HSDP_PYTHON_EXECUTABLE}; "
                  "the Python client is not built")
  return()
endif()

# pybind11's FindPythonLibsNew uses PYTHON_EXECUTABLE: pin it to our interpreter.
set(PYTHON_EXECUTABLE ${HSDP_PYTHON_EXECUTABLE})
find_package(pybind11 CONFIG REQUIRED PATHS ${HSDP_PYBIND11_DIR} NO_DEFAULT_PATH)
message(STATUS "hsdpd: Python client for ${HSDP_PYTHON_EXECUTABLE} (pybind11 ${pybind11_VERSION})")

pybind11_add_module(hsdp_python_ext MODULE NO_EXTRAS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/hsdp_module.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/arguments.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/py_buffer.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/dlpack.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/errors.cc)
target_link_libraries(hsdp_python_ext PRIVATE hsdp_client)
set_target_properties(hsdp_python_ext PROPERTIES
  OUTPUT_NAME _hsdp
  LIBRARY_OUTPUT_DIRECTORY ${HSDP_PYTHON_OUT}/hsdp)
# The static libraries' symbols (the client library, the generated protobuf
# and gRPC code) stay inside the extension: it exports PyInit__hsdp only, so
# nothing in it interposes on, or is interposed by, another copy in the
# process (libhsdp_client.so loaded by a C++ extension, another release).
target_link_options(hsdp_python_ext PRIVATE -Wl,--exclude-libs,ALL)

# Copy the pure-Python package at build time (re-copied when a file changes).
file(GLOB_RECURSE HSDP_PY_SOURCES CONFIGURE_DEPENDS
  RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/hsdp/*.py)
set(HSDP_PY_OUTPUTS)
foreach(rel ${HSDP_PY_SOURCES})
  add_custom_command(
    OUTPUT ${HSDP_PYTHON_OUT}/${rel}
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${CMAKE_CURRENT_SOURCE_DIR}/${rel}
            ${HSDP_PYTHON_OUT}/${rel}
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${rel}
    COMMENT "hsdp python: ${rel}"
    VERBATIM)
  list(APPEND HSDP_PY_OUTPUTS ${HSDP_PYTHON_OUT}/${rel})
endforeach()
# torch's plugin hook (the wheel's torch.backends entry point): a top-level
# module next to the package, so that torch importing it imports no hsdp.
add_custom_command(
  OUTPUT ${HSDP_PYTHON_OUT}/hsdp_autoload.py
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${CMAKE_CURRENT_SOURCE_DIR}/hsdp_autoload.py
          ${HSDP_PYTHON_OUT}/hsdp_autoload.py
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/hsdp_autoload.py
  COMMENT "hsdp python: hsdp_autoload.py"
  VERBATIM)
list(APPEND HSDP_PY_OUTPUTS ${HSDP_PYTHON_OUT}/hsdp_autoload.py)
add_custom_target(hsdp_python_package ALL DEPENDS ${HSDP_PY_OUTPUTS})
add_dependencies(hsdp_python_ext hsdp_python_package)

# `ninja hsdp_python` builds everything `import hsdp` needs.
add_custom_target(hsdp_python DEPENDS hsdp_python_ext hsdp_python_package)

# Install rules of the component `hsdp_python` (the wheel: pyproject.toml's
# install.components): the package hsdp/ with its extension. EXCLUDE_FROM_ALL:
# a plain `cmake --install` (the node's files, the .deb) leaves them out.
if(SKBUILD)
  set(hsdp_py_dest hsdp)
else()
  set(hsdp_py_dest lib/python3/dist-packages/hsdp)
endif()
set(HSDP_PYTHON_INSTALL_DIR ${hsdp_py_dest} CACHE STRING
    "Where `cmake --install --component hsdp_python` puts the package hsdp")
install(TARGETS hsdp_python_ext
  LIBRARY DESTINATION ${HSDP_PYTHON_INSTALL_DIR} COMPONENT hsdp_python EXCLUDE_FROM_ALL)
get_filename_component(hsdp_py_root ${HSDP_PYTHON_INSTALL_DIR} DIRECTORY)
if(hsdp_py_root STREQUAL "")
  set(hsdp_py_root .)
endif()
install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/hsdp_autoload.py
  DESTINATION ${hsdp_py_root} COMPONENT hsdp_python EXCLUDE_FROM_ALL)
foreach(rel ${HSDP_PY_SOURCES})
  get_filename_component(sub ${rel} DIRECTORY)
  string(REGEX REPLACE "^hsdp/?" "" sub "${sub}")
  install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/${rel}
    DESTINATION ${HSDP_PYTHON_INSTALL_DIR}/${sub} COMPONENT hsdp_python EXCLUDE_FROM_ALL)
endforeach()
