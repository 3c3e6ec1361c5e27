/* The memory timeline SVG (svg_timeline.h). */
#include "svg_timeline.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "capuchin/error.h"
#include "svg_plot.h"

#define C_UNMANAGED "#80868b"
#define C_PLANNED "#1a73e8"
#define C_BUDGET "#d93025"
#define C_FLOOR "#5f6368"

/* The plot's x is in ms, its y in MiB. */

/* The step curve of c as a path; closed to the x axis when `area`. */
static void curve_path(FILE *f, const cap_svg_scale_t *s, const cap_curve_t *c,
                       int64_t end_ns, bool area) {
  if (c->n_points == 0)
    return;
  double x0 = cap_svg_x(s, (double)c->points[0].t_ns / 1e6);
  double last_x = x0, last_y = cap_svg_y(s, (double)c->points[0].bytes / 1048576.0);
  fprintf(f, "M%.1f,%.1f", x0, area ? cap_svg_y(s, 0) : last_y);
  if (area)
    fprintf(f, "V%.1f", last_y);
  for (uint32_t i = 1; i < c->n_points; i++) {
    double x = cap_svg_x(s, (double)c->points[i].t_ns / 1e6);
    double y = cap_svg_y(s, (double)c->points[i].bytes / 1048576.0);
    if (fabs(y - last_y) < 0.05)
      continue; /* same height: the step continues */
    if (x - last_x >= 0.05)
      fprintf(f, "H%.1f", x);
    fprintf(f, "V%.1f", y);
    last_x = x;
    last_y = y;
  }
  double xe = cap_svg_x(s, (double)end_ns / 1e6);
  if (xe > last_x)
    fprintf(f, "H%.1f", xe);
  if (area)
    fprintf(f, "V%.1fZ", cap_svg_y(s, 0));
}

static void peak_marker(FILE *f, const cap_svg_scale_t *s, const cap_curve_t *c,
                        const char *color, const char *what, bool above) {
  double mx = cap_svg_x(s, (double)c->peak_t_ns / 1e6);
  double mib = (double)c->peak_bytes / 1048576.0;
  double my = cap_svg_y(s, mib);
  char n[32];
  cap_svg_num(n, sizeof n, mib);
  bool right = mx > CAP_SVG_ML + CAP_SVG_PW * 0.62;
  fprintf(f,
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"%s\" "
          "stroke=\"#fff\" stroke-width=\"1.5\"/>\n",
          mx, my, color);
  fprintf(f,
          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12.5\" fill=\"%s\" "
          "font-weight=\"bold\" text-anchor=\"%s\" " CAP_SVG_HALO ">%s peak %s MiB "
          "at %.1f ms</text>\n",
          mx + (right ? -8 : 8), my + (above ? -9 : 17), color,
          right ? "end" : "start", what, n, (double)c->peak_t_ns / 1e6);
}

int cap_svg_timeline_write(FILE *f, const cap_svg_timeline_t *tl) {
  if (!f || !tl || !tl->unmanaged || tl->unmanaged->n_points == 0)
    return CAP_EINVAL;
  const cap_curve_t *um = tl->unmanaged, *pl = tl->planned;
  char a[32];

  /* Scales: time to the longer iteration, memory to the highest of the
   * peaks and the budget, with headroom for the labels. */
  double end_ms = (double)tl->unmanaged_end_ns / 1e6;
  if (pl && (double)tl->planned_end_ns / 1e6 > end_ms)
    end_ms = (double)tl->planned_end_ns / 1e6;
  double top = (double)um->peak_bytes;
  if (pl && (double)pl->peak_bytes > top)
    top = (double)pl->peak_bytes;
  if ((double)tl->budget_bytes > top)
    top = (double)tl->budget_bytes;
  cap_svg_scale_t s = cap_svg_scale(end_ms, top / 1048576.0);

  cap_svg_begin(f, tl->title, tl->subtitle);
  cap_svg_grid(f, &s, "time in the iteration (ms)", "device memory (MiB)");

  /* Curves: the unmanaged area behind, the planned area in front. */
  fprintf(f, "<path fill=\"%s\" fill-opacity=\"0.22\" stroke=\"none\" d=\"",
          C_UNMANAGED);
  curve_path(f, &s, um, tl->unmanaged_end_ns, true);
  fprintf(f,
          "\"/>\n<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.4\" "
          "stroke-linejoin=\"round\" d=\"",
          C_UNMANAGED);
  curve_path(f, &s, um, tl->unmanaged_end_ns, false);
  fputs("\"/>\n", f);
  if (pl && pl->n_points) {
    fprintf(f, "<path fill=\"%s\" fill-opacity=\"0.16\" stroke=\"none\" d=\"",
            C_PLANNED);
    curve_path(f, &s, pl, tl->planned_end_ns, true);
    fprintf(f,
            "\"/>\n<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" "
            "stroke-linejoin=\"round\" d=\"",
            C_PLANNED);
    curve_path(f, &s, pl, tl->planned_end_ns, false);
    fputs("\"/>\n", f);
  }

  /* Persistent floor and budget line, labelled at the right end. */
  if (tl->persistent_bytes) {
    double y = cap_svg_y(&s, (double)tl->persistent_bytes / 1048576.0);
    cap_svg_num(a, sizeof a, (double)tl->persistent_bytes / 1048576.0);
    fprintf(f,
            "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"1.2\" stroke-dasharray=\"2 3\"/>\n"
            "<text x=\"%d\" y=\"%.1f\" font-size=\"12\" fill=\"%s\" " CAP_SVG_HALO
            ">persistent (weights, inputs) %s MiB</text>\n",
            CAP_SVG_ML, y, CAP_SVG_ML + CAP_SVG_PW, y, C_FLOOR, CAP_SVG_ML + 8,
            /* Below the floor no curve ever goes: label there when it fits. */
            cap_svg_y(&s, 0) - y >= 20 ? y + 15 : y - 6, C_FLOOR, a);
  }
  if (tl->budget_bytes) {
    double y = cap_svg_y(&s, (double)tl->budget_bytes / 1048576.0);
    cap_svg_num(a, sizeof a, (double)tl->budget_bytes / 1048576.0);
    fprintf(f,
            "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"2\" stroke-dasharray=\"9 5\"/>\n"
            "<text x=\"%d\" y=\"%.1f\" font-size=\"12.5\" font-weight=\"bold\" "
            "fill=\"%s\" " CAP_SVG_HALO ">budget %s MiB</text>\n",
            CAP_SVG_ML, y, CAP_SVG_ML + CAP_SVG_PW, y, C_BUDGET, CAP_SVG_ML + 8, y - 7, C_BUDGET, a);
  }

  /* Peaks. The planned one is labelled below its marker when it sits
   * right under the budget label's line. */
  peak_marker(f, &s, um, "#5f6368", "unmanaged", true);
  if (pl && pl->n_points)
    peak_marker(f, &s, pl, C_PLANNED, "planned", false);

  /* Legend: one row between the subtitle and the plot, clear of every
   * curve and label. */
  int x = CAP_SVG_ML, y = CAP_SVG_MT - 22;
  fputs("<g font-size=\"13\" fill=\"#202124\">\n", f);
  fprintf(f,
          "<rect x=\"%d\" y=\"%d\" width=\"22\" height=\"10\" fill=\"%s\" "
          "fill-opacity=\"0.35\" stroke=\"%s\"/>\n<text x=\"%d\" y=\"%d\">"
          "unmanaged (measured profile)</text>\n",
          x, y - 9, C_UNMANAGED, C_UNMANAGED, x + 30, y);
  x += 250;
  if (pl) {
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"22\" height=\"10\" fill=\"%s\" "
            "fill-opacity=\"0.3\" stroke=\"%s\" stroke-width=\"1.5\"/>\n"
            "<text x=\"%d\" y=\"%d\">planned (simulated)</text>\n",
            x, y - 9, C_PLANNED, C_PLANNED, x + 30, y);
    x += 190;
  }
  if (tl->budget_bytes) {
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
            "stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n"
            "<text x=\"%d\" y=\"%d\">memory budget</text>\n",
            x, y - 4, x + 22, y - 4, C_BUDGET, x + 30, y);
    x += 160;
  }
  if (tl->persistent_bytes) {
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
            "stroke-width=\"1.2\" stroke-dasharray=\"2 3\"/>\n"
            "<text x=\"%d\" y=\"%d\">persistent bytes</text>\n",
            x, y - 4, x + 22, y - 4, C_FLOOR, x + 30, y);
  }
  fputs("</g>\n", f);
  fputs("</svg>\n", f);
  return ferror(f) ? CAP_EIO : 0;
}
