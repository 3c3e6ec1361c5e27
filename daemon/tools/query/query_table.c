/* Result tables for capuchin-query (query_table.h). */
#include "query_table.h"

#include <inttypes.h>
#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"

typedef enum { CELL_NULL, CELL_INT, CELL_REAL, CELL_TEXT } cell_type_t;

typedef struct cell {
  cell_type_t type;
  int64_t i;
  double r;
  char *s;
} cell_t;

struct cap_qtable {
  const cap_qcol_t *cols;
  int n_cols;
  cell_t *cells; /* n_rows * n_cols */
  int n_rows, cap_rows;
};

cap_qtable_t *cap_qtable_create(const cap_qcol_t *cols, int n_cols) {
  cap_qtable_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->cols = cols;
  t->n_cols = n_cols;
  return t;
}

void cap_qtable_destroy(cap_qtable_t *t) {
  if (!t)
    return;
  for (int i = 0; i < t->n_rows * t->n_cols; i++)
    free(t->cells[i].s);
  free(t->cells);
  free(t);
}

int cap_qtable_row(cap_qtable_t *t) {
  if (t->n_rows == t->cap_rows) {
    int nc = t->cap_rows ? t->cap_rows * 2 : 32;
    cell_t *n = realloc(t->cells, (size_t)nc * (size_t)t->n_cols * sizeof *n);
    if (!n)
      return CAP_ENOMEM;
    t->cells = n;
    t->cap_rows = nc;
  }
  memset(&t->cells[(size_t)t->n_rows * (size_t)t->n_cols], 0,
         (size_t)t->n_cols * sizeof(cell_t));
  t->n_rows++;
  return 0;
}

static cell_t *cur(cap_qtable_t *t, int col) {
  if (t->n_rows == 0 || col < 0 || col >= t->n_cols)
    return NULL;
  cell_t *c = &t->cells[(size_t)(t->n_rows - 1) * (size_t)t->n_cols + col];
  free(c->s);
  memset(c, 0, sizeof *c);
  return c;
}

int cap_qtable_set_text(cap_qtable_t *t, int col, const char *v) {
  cell_t *c = cur(t, col);
  if (!c)
    return CAP_EINVAL;
  if (!v)
    return 0;
  if (!(c->s = strdup(v)))
    return CAP_ENOMEM;
  c->type = CELL_TEXT;
  return 0;
}

int cap_qtable_set_int(cap_qtable_t *t, int col, int64_t v) {
  cell_t *c = cur(t, col);
  if (!c)
    return CAP_EINVAL;
  c->type = CELL_INT;
  c->i = v;
  return 0;
}

int cap_qtable_set_real(cap_qtable_t *t, int col, double v) {
  cell_t *c = cur(t, col);
  if (!c)
    return CAP_EINVAL;
  if (!isfinite(v))
    return 0; /* NULL: JSON has no NaN */
  c->type = CELL_REAL;
  c->r = v;
  return 0;
}

int cap_qtable_add_rows(cap_qtable_t *t, sqlite3_stmt *st) {
  int step, rc;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if ((rc = cap_qtable_row(t)) != 0)
      return rc;
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n && c < t->n_cols; c++) {
      switch (sqlite3_column_type(st, c)) {
      case SQLITE_NULL:
        break;
      case SQLITE_INTEGER:
        rc = cap_qtable_set_int(t, c, sqlite3_column_int64(st, c));
        break;
      case SQLITE_FLOAT:
        rc = cap_qtable_set_real(t, c, sqlite3_column_double(st, c));
        break;
      default:
        rc =
            cap_qtable_set_text(t, c, (const char *)sqlite3_column_text(st, c));
        break;
      }
      if (rc != 0)
        return rc;
    }
  }
  return step == SQLITE_DONE ? 0 : CAP_ESTORE;
}

/* --- formatting ----------------------------------------------------------- */

void cap_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"':
      fputs("\\\"", f);
      break;
    case '\\':
      fputs("\\\\", f);
      break;
    case '\n':
      fputs("\\n", f);
      break;
    case '\r':
      fputs("\\r", f);
      break;
    case '\t':
      fputs("\\t", f);
      break;
    default:
      if (*p < 0x20)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
  }
  fputc('"', f);
}

/* Shortest text that reads back as the same double. */
static void fmt_real(char *buf, size_t len, double v) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      break;
  }
}

/* Raw text of a cell for JSON/CSV. */
static void raw(const cell_t *c, char *buf, size_t len) {
  switch (c->type) {
  case CELL_NULL:
    buf[0] = '\0';
    break;
  case CELL_INT:
    snprintf(buf, len, "%" PRId64, c->i);
    break;
  case CELL_REAL:
    fmt_real(buf, len, c->r);
    break;
  case CELL_TEXT:
    snprintf(buf, len, "%s", c->s);
    break;
  }
}

static double num(const cell_t *c) {
  return c->type == CELL_INT ? (double)c->i : c->r;
}

/* Human text of a cell for the table. */
static void human(const cell_t *c, cap_qcol_kind_t kind, char *buf,
                  size_t len) {
  if (c->type == CELL_NULL) {
    snprintf(buf, len, "-");
    return;
  }
  if (c->type == CELL_TEXT) {
    snprintf(buf, len, "%s", c->s);
    return;
  }
  switch (kind) {
  case CAP_QCOL_BYTES:
    snprintf(buf, len, "%.1f", num(c) / 1048576.0);
    break;
  case CAP_QCOL_NS:
    snprintf(buf, len, "%.3f", num(c) / 1e6);
    break;
  case CAP_QCOL_REAL:
    snprintf(buf, len, "%.2f", num(c));
    break;
  case CAP_QCOL_PCT:
    snprintf(buf, len, "%+.1f%%", num(c));
    break;
  default:
    raw(c, buf, len);
  }
}

static bool right_aligned(cap_qcol_kind_t k) {
  return k != CAP_QCOL_TEXT;
}

static void print_table(const cap_qtable_t *t, FILE *f) {
  int *w = calloc((size_t)t->n_cols, sizeof *w);
  char buf[512];
  if (!w)
    return;
  for (int c = 0; c < t->n_cols; c++) {
    const char *title = t->cols[c].title ? t->cols[c].title : t->cols[c].name;
    w[c] = (int)strlen(title);
  }
  for (int r = 0; r < t->n_rows; r++)
    for (int c = 0; c < t->n_cols; c++) {
      human(&t->cells[(size_t)r * (size_t)t->n_cols + c], t->cols[c].kind, buf,
            sizeof buf);
      int n = (int)strlen(buf);
      w[c] = n > w[c] ? n : w[c];
    }
  for (int c = 0; c < t->n_cols; c++) {
    const char *title = t->cols[c].title ? t->cols[c].title : t->cols[c].name;
    if (c == t->n_cols - 1 && !right_aligned(t->cols[c].kind))
      fprintf(f, c ? "  %s" : "%s", title); /* no trailing spaces */
    else
      fprintf(f, c ? "  %*s" : "%*s",
              right_aligned(t->cols[c].kind) ? w[c] : -w[c], title);
  }
  fputc('\n', f);
  for (int c = 0; c < t->n_cols; c++) {
    fputs(c ? "  " : "", f);
    for (int i = 0; i < w[c]; i++)
      fputc('-', f);
  }
  fputc('\n', f);
  for (int r = 0; r < t->n_rows; r++) {
    for (int c = 0; c < t->n_cols; c++) {
      human(&t->cells[(size_t)r * (size_t)t->n_cols + c], t->cols[c].kind, buf,
            sizeof buf);
      bool last = c == t->n_cols - 1;
      if (last && !right_aligned(t->cols[c].kind))
        fprintf(f, c ? "  %s" : "%s", buf); /* no trailing spaces */
      else
        fprintf(f, c ? "  %*s" : "%*s",
                right_aligned(t->cols[c].kind) ? w[c] : -w[c], buf);
    }
    fputc('\n', f);
  }
  if (t->n_rows == 0)
    fputs("(none)\n", f);
  free(w);
}

void cap_qtable_print_json_row(const cap_qtable_t *t, int r, FILE *f) {
  char buf[512];
  fputc('{', f);
  for (int c = 0; c < t->n_cols; c++) {
    const cell_t *cell = &t->cells[(size_t)r * (size_t)t->n_cols + c];
    if (c)
      fputs(", ", f);
    cap_json_string(f, t->cols[c].name);
    fputs(": ", f);
    if (cell->type == CELL_NULL) {
      fputs("null", f);
    } else if (cell->type == CELL_TEXT) {
      cap_json_string(f, cell->s);
    } else {
      raw(cell, buf, sizeof buf);
      fputs(buf, f);
    }
  }
  fputc('}', f);
}

static void csv_field(FILE *f, const char *s) {
  if (strpbrk(s, ",\"\r\n") == NULL) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

int cap_qtable_print(const cap_qtable_t *t, cap_qfmt_t fmt, FILE *f) {
  char buf[512];
  switch (fmt) {
  case CAP_QFMT_TABLE:
    print_table(t, f);
    break;
  case CAP_QFMT_JSON:
    fputc('[', f);
    for (int r = 0; r < t->n_rows; r++) {
      fputs(r ? ",\n " : "\n ", f);
      cap_qtable_print_json_row(t, r, f);
    }
    fputs(t->n_rows ? "\n]\n" : "]\n", f);
    break;
  case CAP_QFMT_CSV:
    for (int c = 0; c < t->n_cols; c++) {
      if (c)
        fputc(',', f);
      csv_field(f, t->cols[c].name);
    }
    fputs("\r\n", f);
    for (int r = 0; r < t->n_rows; r++) {
      for (int c = 0; c < t->n_cols; c++) {
        if (c)
          fputc(',', f);
        const cell_t *cell = &t->cells[(size_t)r * (size_t)t->n_cols + c];
        if (cell->type == CELL_TEXT) {
          csv_field(f, cell->s);
        } else {
          raw(cell, buf, sizeof buf);
          csv_field(f, buf);
        }
      }
      fputs("\r\n", f);
    }
    break;
  }
  return ferror(f) ? CAP_EIO : 0;
}
