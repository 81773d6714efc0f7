# Python client: the pybind11 extension hsdp._hsdp and the pure-Python package
# `hsdp`, assembled in ${CMAKE_BINARY_DIR}/python/hsdp so that
#   PYTHONPATH=build/python /usr/bin/python3 -c 'import hsdp'
# works after a build. The extension never links libtorch: one build serves
# every torch version installed for that interpreter.

set(HSDP_PYTHON_EXECUTABLE /usr/bin/python3 CACHE FILEPATH
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
  ${CMAKE_CURRENT_SOURCE_DIR}/src/py_buffer.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/dlpack.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/errors.cc)
target_link_libraries(hsdp_python_ext PRIVATE hsdp_client)
set_target_properties(hsdp_python_ext PROPERTIES
  OUTPUT_NAME _hsdp
  LIBRARY_OUTPUT_DIRECTORY ${HSDP_PYTHON_OUT}/hsdp)

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
add_custom_target(hsdp_python_package ALL DEPENDS ${HSDP_PY_OUTPUTS})
add_dependencies(hsdp_python_ext hsdp_python_package)

# `ninja hsdp_python` builds everything `import hsdp` needs.
add_custom_target(hsdp_python DEPENDS hsdp_python_ext hsdp_python_package)
