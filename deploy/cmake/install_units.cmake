# Runs at install time, from deploy/CMakeLists.txt: CMAKE_INSTALL_PREFIX is
# the prefix installed to now (and DESTDIR, which file(INSTALL) adds, the
# staging root). Installs the systemd units with the daemon's real paths,
# and the example config as the daemon's config unless one is there.
set(prefix "${CMAKE_INSTALL_PREFIX}")
# The GNU rule: /usr's configuration lives in /etc, any other prefix's in
# <prefix>/etc.
if(prefix STREQUAL "/usr")
  set(sysconfdir /etc)
else()
  set(sysconfdir "${prefix}/etc")
endif()

# A folder of its own: `cmake --install` and cpack may run at once.
string(RANDOM LENGTH 12 stage)
set(stage "${CAP_STAGE_DIR}/${stage}")
file(MAKE_DIRECTORY "${stage}")
foreach(unit capuchind.service capuchind.socket)
  file(READ "${CAP_DEPLOY_DIR}/${unit}" text)
  string(REPLACE "/usr/local/bin/" "${prefix}/${CAP_BINDIR}/" text "${text}")
  string(REPLACE "/etc/capuchin/" "${sysconfdir}/capuchin/" text "${text}")
  string(REPLACE "/usr/share/doc/capuchin/" "${prefix}/${CAP_DOCDIR}/" text "${text}")
  file(WRITE "${stage}/${unit}" "${text}")
endforeach()
file(INSTALL DESTINATION "${prefix}/lib/systemd/system" TYPE FILE
     FILES "${stage}/capuchind.service" "${stage}/capuchind.socket")
file(REMOVE_RECURSE "${stage}")

# Never overwrite an operator's config (the .deb marks it a conffile).
if(NOT EXISTS "$ENV{DESTDIR}${sysconfdir}/capuchin/capuchind.conf")
  file(INSTALL DESTINATION "${sysconfdir}/capuchin" TYPE FILE
       RENAME capuchind.conf FILES "${CAP_DEPLOY_DIR}/capuchind.conf.example")
endif()
