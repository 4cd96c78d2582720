# Defines frugal::openblas: OpenBLAS's CBLAS, preferring Debian's OpenMP build
# (its threads cooperate with frugal's OpenMP regions instead of spinning
# against them, as the pthread build's do).
if(NOT TARGET frugal::openblas)
  set(_arch_dirs)
  if(CMAKE_LIBRARY_ARCHITECTURE)
    set(_arch_dirs /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
    set(_arch_inc /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
  endif()
  find_library(FRUGAL_OPENBLAS_LIBRARY NAMES openblas HINTS ${_arch_dirs})
  find_path(FRUGAL_OPENBLAS_INCLUDE_DIR cblas.h HINTS ${_arch_inc} PATH_SUFFIXES openblas)
  if(NOT FRUGAL_OPENBLAS_LIBRARY OR NOT FRUGAL_OPENBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "frugal needs OpenBLAS: on Debian, apt-get install libopenblas-openmp-dev")
  endif()
  add_library(frugal::openblas INTERFACE IMPORTED)
  set_target_properties(frugal::openblas PROPERTIES INTERFACE_LINK_LIBRARIES "${FRUGAL_OPENBLAS_LIBRARY}"
                                                    INTERFACE_INCLUDE_DIRECTORIES "${FRUGAL_OPENBLAS_INCLUDE_DIR}")
endif()
