/*
 * What the SVG pictures of capuchin-query share: the page, the plot area,
 * nice axis ticks with a grid, number formatting and XML escaping. Plain
 * SVG 1.1, no scripts or external fonts.
 */
#ifndef CAPUCHIN_DAEMON_SVG_PLOT_H
#define CAPUCHIN_DAEMON_SVG_PLOT_H

#include <stddef.h>
#include <stdio.h>

#define CAP_SVG_W 1200
#define CAP_SVG_H 700
#define CAP_SVG_ML 100 /* margins of the plot area */
#define CAP_SVG_MR 40
#define CAP_SVG_MT 112
#define CAP_SVG_MB 76
#define CAP_SVG_PW (CAP_SVG_W - CAP_SVG_ML - CAP_SVG_MR)
#define CAP_SVG_PH (CAP_SVG_H - CAP_SVG_MT - CAP_SVG_MB)
/* Labels over shapes get a white halo so they stay readable. */
#define CAP_SVG_HALO                                                           \
  "stroke=\"#ffffff\" stroke-width=\"3.5\" paint-order=\"stroke\" "            \
  "stroke-linejoin=\"round\""

/* The plot's data ranges: x from 0 to xmax, y from 0 to ymax. */
typedef struct cap_svg_scale {
  double xmax, ymax;
  double xstep, ystep; /* tick spacing */
} cap_svg_scale_t;

/* Ranges that end on a tick, about 10 ticks across and 7 up, for data up
 * to xdata and ydata (headroom above ydata included). */
cap_svg_scale_t cap_svg_scale(double xdata, double ydata);

double cap_svg_x(const cap_svg_scale_t *s, double x);
double cap_svg_y(const cap_svg_scale_t *s, double y);

/* XML-escaped text. */
void cap_svg_text(FILE *f, const char *s);
/* "12,345", or "12.5" for small fractional values. */
void cap_svg_num(char *buf, size_t len, double v);

/* The document's start: the svg element, title, white page, heading and
 * subtitle (may be NULL). */
void cap_svg_begin(FILE *f, const char *title, const char *subtitle);
/* Grid lines, tick labels and the two axis titles. */
void cap_svg_grid(FILE *f, const cap_svg_scale_t *s, const char *xtitle,
                  const char *ytitle);
/* A dashed horizontal line across the plot at y, labelled at its left end
 * ("budget 2,932 MiB"), above it. */
void cap_svg_hline(FILE *f, const cap_svg_scale_t *s, double y,
                   const char *color, const char *label);

#endif /* CAPUCHIN_DAEMON_SVG_PLOT_H */
