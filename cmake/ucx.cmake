# Which UCX KVCR builds against: the system's (Debian 12: libucx-dev, 1.13.1),
# or with -DKVCR_UCX_ROOT=<prefix> the one installed there, with its
# lib/pkgconfig/ucx.pc (scripts/ucx-modern.sh unpacks UCX 1.22 so). Across
# hosts the later one is the one to run: 1.13 aborts a process whose TCP
# connection to a peer fails while UCX sets it up (docs/ARCHITECTURE.md,
# "Peer failures over TCP").
#
# Defines PkgConfig::UCX and UCX_VERSION, as pkg_check_modules does. With a
# root, every program and library of the build finds that UCX at run time by
# its RUNPATH (CMake's build RPATH names the directory of every library
# linked by full path; the install RPATH names it too), never through the
# user's environment, and the configure fails if any UCX library would come
# from elsewhere.
set(KVCR_UCX_ROOT "" CACHE PATH
    "Build against the UCX installed at this prefix (scripts/ucx-modern.sh) instead of the system's")

if(KVCR_UCX_ROOT STREQUAL "")
  pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
  return()
endif()

get_filename_component(KVCR_UCX_ROOT_REAL "${KVCR_UCX_ROOT}" REALPATH)
if(NOT EXISTS "${KVCR_UCX_ROOT_REAL}/lib/pkgconfig/ucx.pc")
  message(FATAL_ERROR "KVCR_UCX_ROOT=${KVCR_UCX_ROOT}: no lib/pkgconfig/ucx.pc there "
                      "(scripts/ucx-modern.sh makes one)")
endif()
# First on pkg-config's path for this configure: ucx.pc and the ucx-uct,
# ucx-ucs it requires come from the root; the other packages have no .pc there.
set(ENV{PKG_CONFIG_PATH} "${KVCR_UCX_ROOT_REAL}/lib/pkgconfig:$ENV{PKG_CONFIG_PATH}")
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)

set(KVCR_UCX_LIBDIR "${KVCR_UCX_ROOT_REAL}/lib")
foreach(lib ${UCX_LINK_LIBRARIES})
  get_filename_component(dir "${lib}" DIRECTORY)
  get_filename_component(dir "${dir}" REALPATH)
  if(NOT dir STREQUAL KVCR_UCX_LIBDIR)
    message(FATAL_ERROR "KVCR_UCX_ROOT=${KVCR_UCX_ROOT}: ${lib} is not from ${KVCR_UCX_LIBDIR}")
  endif()
endforeach()
# The installed libkvcr, the `kvcr` tool and the ABI test's install find it
# there too (the build tree gets it from CMake's build RPATH).
list(APPEND CMAKE_INSTALL_RPATH "${KVCR_UCX_LIBDIR}")
message(STATUS "UCX ${UCX_VERSION} from ${KVCR_UCX_ROOT_REAL} (run-time path: ${KVCR_UCX_LIBDIR})")
