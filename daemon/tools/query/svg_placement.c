/* The placement SVG (svg_placement.h). */
#include "svg_placement.h"

#include <string.h>

#include "capuchin/error.h"
#include "svg_plot.h"

#define C_BUDGET "#d93025"
#define C_ARENA "#5f6368"

/* One colour per way a block gets its tensor, in cap_residency_kind_t
 * order, with the legend's words. */
static const struct {
  const char *color, *label;
} kinds[] = {
    {"#1a73e8", "first touch"},  {"#f29900", "prefetched"},
    {"#188038", "recomputed"},   {"#81c995", "recompute temporary"},
    {"#9334e6", "evicted weight"},
};

int cap_svg_placement_write(FILE *f, const cap_svg_placement_t *pl) {
  if (!f || !pl || !pl->blocks || !pl->n)
    return CAP_EINVAL;
  int64_t end = pl->end_ns;
  for (uint32_t i = 0; i < pl->n; i++)
    if (pl->blocks[i].end_ns > end)
      end = pl->blocks[i].end_ns;
  double top = (double)(pl->room_bytes > pl->arena_bytes ? pl->room_bytes
                                                         : pl->arena_bytes);
  cap_svg_scale_t s = cap_svg_scale((double)end / 1e6, top / 1048576.0);

  cap_svg_begin(f, pl->title, pl->subtitle);
  cap_svg_grid(f, &s, "time in the iteration (ms)",
               "address in the arena (MiB)");

  /* Blocks, each at least half a pixel wide so that short stays show. */
  fputs("<g fill-opacity=\"0.78\" stroke=\"#ffffff\" stroke-width=\"0.3\">\n",
        f);
  for (uint32_t i = 0; i < pl->n; i++) {
    const cap_block_t *b = &pl->blocks[i];
    unsigned k = (unsigned)b->kind < sizeof kinds / sizeof *kinds ? b->kind : 0;
    double x0 = cap_svg_x(&s, (double)b->start_ns / 1e6);
    double x1 = cap_svg_x(&s, (double)b->end_ns / 1e6);
    double y1 = cap_svg_y(&s, (double)b->offset / 1048576.0);
    double y0 = cap_svg_y(&s, (double)(b->offset + b->bytes) / 1048576.0);
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
            "fill=\"%s\"><title>tensor %u, %s, %.1f MiB at %.1f MiB, "
            "%.3f-%.3f ms</title></rect>\n",
            x0, y0, x1 - x0 < 0.5 ? 0.5 : x1 - x0, y1 - y0 < 0.3 ? 0.3 : y1 - y0,
            kinds[k].color, b->tensor, kinds[k].label,
            (double)b->bytes / 1048576.0, (double)b->offset / 1048576.0,
            (double)b->start_ns / 1e6, (double)b->end_ns / 1e6);
  }
  fputs("</g>\n", f);

  char num[32], label[96];
  cap_svg_num(num, sizeof num, (double)pl->arena_bytes / 1048576.0);
  snprintf(label, sizeof label, "arena %s MiB", num);
  cap_svg_hline(f, &s, (double)pl->arena_bytes / 1048576.0, C_ARENA, label);
  if (pl->room_bytes) {
    cap_svg_num(num, sizeof num, (double)pl->room_bytes / 1048576.0);
    snprintf(label, sizeof label, "budget: room for the arena %s MiB", num);
    /* Right-aligned so that it does not sit on the arena's label. */
    double y = cap_svg_y(&s, (double)pl->room_bytes / 1048576.0);
    fprintf(f,
            "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"2\" stroke-dasharray=\"9 5\"/>\n"
            "<text x=\"%d\" y=\"%.1f\" font-size=\"12.5\" font-weight=\"bold\" "
            "fill=\"%s\" text-anchor=\"end\" " CAP_SVG_HALO ">",
            CAP_SVG_ML, y, CAP_SVG_ML + CAP_SVG_PW, y, C_BUDGET,
            CAP_SVG_ML + CAP_SVG_PW - 8, y - 7, C_BUDGET);
    cap_svg_text(f, label);
    fputs("</text>\n", f);
  }

  /* Legend: one row between the subtitle and the plot. */
  int x = CAP_SVG_ML, y = CAP_SVG_MT - 22;
  fputs("<g font-size=\"13\" fill=\"#202124\">\n", f);
  for (unsigned k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"18\" height=\"10\" fill=\"%s\" "
            "fill-opacity=\"0.78\"/>\n<text x=\"%d\" y=\"%d\">%s</text>\n",
            x, y - 9, kinds[k].color, x + 24, y, kinds[k].label);
    x += 40 + 8 * (int)strlen(kinds[k].label);
  }
  if (pl->room_bytes)
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
            "stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n"
            "<text x=\"%d\" y=\"%d\">memory budget</text>\n",
            x, y - 4, x + 22, y - 4, C_BUDGET, x + 30, y);
  fputs("</g>\n</svg>\n", f);
  return ferror(f) ? CAP_EIO : 0;
}
