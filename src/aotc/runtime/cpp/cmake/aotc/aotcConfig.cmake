# aotc's C++ runtime for CMake: find_package(aotc) with CMAKE_PREFIX_PATH set to the output of
# `aotc config --cmake-prefix-path` (this folder's parent, and torch's own CMake folder) gives the
# imported target aotc::runtime: libaotc_runtime.so (aotc::Module, the plan runner), its
# headers, and what it links: libtorch (found through torch's TorchConfig.cmake) and OpenSSL's
# libcrypto (FindOpenSSL; Debian and Ubuntu: apt-get install libssl-dev).
include(CMakeFindDependencyMacro)
find_dependency(Torch)
find_dependency(OpenSSL COMPONENTS Crypto)
get_filename_component(_aotc_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT EXISTS "${_aotc_root}/lib/libaotc_runtime.so")
  set(aotc_FOUND FALSE)
  set(aotc_NOT_FOUND_MESSAGE "aotc was installed without its C++ runtime (${_aotc_root}/lib/libaotc_runtime.so); reinstall it with torch importable: pip install --no-build-isolation .")
  return()
endif()
if(NOT TARGET aotc::runtime)
  add_library(aotc::runtime SHARED IMPORTED)
  set_target_properties(aotc::runtime PROPERTIES
    IMPORTED_LOCATION "${_aotc_root}/lib/libaotc_runtime.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_aotc_root}/include"
    INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES};OpenSSL::Crypto"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
endif()
set(aotc_FOUND TRUE)
