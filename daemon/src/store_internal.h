/*
 * Internals shared by store.c and store_schema.c (not for other modules).
 */
#ifndef CAPUCHIN_DAEMON_STORE_INTERNAL_H
#define CAPUCHIN_DAEMON_STORE_INTERNAL_H

#include <sqlite3.h>
#include <stdio.h>

#include "capuchin/error.h"
#include "store.h"

/* Record a printf-style message as this thread's last store error and
 * return code. */
int cap__store_fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Read PRAGMA user_version. Returns 0, CAP_ECORRUPT for a file that is not
 * a database, CAP_ESTORE otherwise. */
int cap__store_user_version(sqlite3 *db, int *version);

/* Run the forward migrations from from_version up to
 * CAP_STORE_SCHEMA_VERSION, each in one transaction. */
int cap__store_migrate(sqlite3 *db, const char *path, int from_version);

#endif /* CAPUCHIN_DAEMON_STORE_INTERNAL_H */
