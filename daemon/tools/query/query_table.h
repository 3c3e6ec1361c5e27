/*
 * Result tables for capuchin-query: rows of typed cells collected from
 * SQLite or computed in C, printed as an aligned text table (bytes shown in
 * MiB, nanoseconds in ms), JSON (an array of objects with raw values;
 * NULL -> null) or CSV (RFC 4180 quoting, header row).
 */
#ifndef CAPUCHIN_DAEMON_QUERY_TABLE_H
#define CAPUCHIN_DAEMON_QUERY_TABLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct sqlite3_stmt;

typedef enum {
  CAP_QFMT_TABLE,
  CAP_QFMT_JSON,
  CAP_QFMT_CSV,
} cap_qfmt_t;

/* How a column is shown in the text table (JSON and CSV print raw). */
typedef enum {
  CAP_QCOL_TEXT,  /* string */
  CAP_QCOL_INT,   /* integer */
  CAP_QCOL_REAL,  /* double, 2 decimals in tables */
  CAP_QCOL_BYTES, /* integer bytes; tables show MiB */
  CAP_QCOL_NS,    /* integer ns; tables show ms */
  CAP_QCOL_PCT,   /* double percent; tables show "+1.2 %" */
} cap_qcol_kind_t;

typedef struct cap_qcol {
  const char *name;  /* JSON key and CSV header ("budget_bytes") */
  const char *title; /* table header ("budget MiB"); NULL -> name */
  cap_qcol_kind_t kind;
} cap_qcol_t;

typedef struct cap_qtable cap_qtable_t;

/* cols is borrowed and must outlive the table. NULL on out of memory. */
cap_qtable_t *cap_qtable_create(const cap_qcol_t *cols, int n_cols);
void cap_qtable_destroy(cap_qtable_t *t); /* NULL is a no-op */

/* Start a row, then set its cells by column index (unset cells are NULL). */
int cap_qtable_row(cap_qtable_t *t);
int cap_qtable_set_text(cap_qtable_t *t, int col, const char *v);
int cap_qtable_set_int(cap_qtable_t *t, int col, int64_t v);
int cap_qtable_set_real(cap_qtable_t *t, int col, double v);

/* Append every row of a stepped-from-start statement whose result columns
 * map one to one onto the table's columns. Returns 0 or CAP_ESTORE. */
int cap_qtable_add_rows(cap_qtable_t *t, struct sqlite3_stmt *st);

/* Print the whole table. JSON: an array of objects. */
int cap_qtable_print(const cap_qtable_t *t, cap_qfmt_t fmt, FILE *f);
/* Print row i as one JSON object (for composite JSON documents). */
void cap_qtable_print_json_row(const cap_qtable_t *t, int i, FILE *f);

/* JSON string literal with escapes. */
void cap_json_string(FILE *f, const char *s);

#endif /* CAPUCHIN_DAEMON_QUERY_TABLE_H */
