# .deb packages (`cpack -G DEB` in the build folder), one per component:
#   capuchind               the daemon, capuchin-query, capuchin-sim,
#                           capuchin-replay, systemd units, config, man pages
#   libcapuchin-client1     the shared library a training job loads
#   libcapuchin-client-dev  headers, the .so link, pkg-config, CMake package
# Included last from the top CMakeLists.txt: CPack takes the install rules
# as they stand when it is included.
set(CPACK_PACKAGE_NAME capuchin)
set(CPACK_PACKAGE_VENDOR "Capuchin")
# The Maintainer field: a placeholder until whoever publishes the packages
# sets their own (-DCPACK_PACKAGE_CONTACT="Name <email>").
if(NOT CPACK_PACKAGE_CONTACT)
  set(CPACK_PACKAGE_CONTACT "Capuchin maintainers <capuchin@localhost>")
endif()
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
# Install with DESTDIR into the staging root and the real prefix, so that
# what the install scripts compute from CMAKE_INSTALL_PREFIX (the units'
# paths, /etc) is what the package will hold.
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon library dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)

# Dependencies are Debian 12's runtime packages, written out rather than
# found by dpkg-shlibdeps: that needs dpkg-dev, and it refuses a library
# that no package owns (libcudart from a CUDA toolkit in /usr/local).
set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME capuchind)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS
    "libc6 (>= 2.36), libuv1 (>= 1.44), libprotobuf-c1 (>= 1.4), libsqlite3-0 (>= 3.40), adduser")
set(CPACK_COMPONENT_DAEMON_DESCRIPTION
    "Capuchin daemon and tools\n capuchind plans GPU memory for the training jobs of one node (swap to\n host memory and recompute); capuchin-query, capuchin-sim and\n capuchin-replay inspect its database, simulate plans and replay traces.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${CMAKE_CURRENT_LIST_DIR}/debian/conffiles
    ${CMAKE_CURRENT_LIST_DIR}/debian/postinst)

set(CPACK_DEBIAN_LIBRARY_PACKAGE_NAME libcapuchin-client1)
set(CPACK_DEBIAN_LIBRARY_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBRARY_PACKAGE_DEPENDS "libc6 (>= 2.36), libprotobuf-c1 (>= 1.4)")
set(CPACK_COMPONENT_LIBRARY_DESCRIPTION
    "Capuchin client library\n libcapuchin-client, linked into a training job: reports tensor accesses\n to capuchind and carries out its plans.")
set(CPACK_DEBIAN_LIBRARY_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/debian/triggers)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libcapuchin-client-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libcapuchin-client1 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "Capuchin client library: development files\n The headers, pkg-config file (capuchin-client) and CMake package\n (find_package(Capuchin), target Capuchin::client) of libcapuchin-client.")

include(CPack)
