/* Shared SVG plotting (svg_plot.h). */
#include "svg_plot.h"

#include <math.h>
#include <string.h>

#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"

/* A "nice" tick step (1, 2, 2.5 or 5 x 10^k) giving about `target` ticks. */
static double nice_step(double range, int target) {
  double raw = range / target;
  double mag = pow(10, floor(log10(raw)));
  double norm = raw / mag;
  double nice = norm <= 1     ? 1
                : norm <= 2   ? 2
                : norm <= 2.5 ? 2.5
                : norm <= 5   ? 5
                              : 10;
  return nice * mag;
}

cap_svg_scale_t cap_svg_scale(double xdata, double ydata) {
  if (!(xdata > 0))
    xdata = 1;
  if (!(ydata > 0))
    ydata = 1;
  double xstep = nice_step(xdata, 10), ystep = nice_step(ydata * 1.12, 7);
  return (cap_svg_scale_t){ceil(xdata / xstep - 1e-9) * xstep,
                           ceil(ydata * 1.12 / ystep - 1e-9) * ystep, xstep,
                           ystep};
}

double cap_svg_x(const cap_svg_scale_t *s, double x) {
  return CAP_SVG_ML + x / s->xmax * CAP_SVG_PW;
}

double cap_svg_y(const cap_svg_scale_t *s, double y) {
  return CAP_SVG_MT + CAP_SVG_PH - y / s->ymax * CAP_SVG_PH;
}

void cap_svg_text(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      if ((unsigned char)*s >= 0x20 || *s == '\t')
        fputc(*s, f);
    }
  }
}

void cap_svg_num(char *buf, size_t len, double v) {
  if (fabs(v - round(v)) > 1e-9 && fabs(v) < 1000) {
    snprintf(buf, len, "%.*f", fabs(v) < 10 ? 2 : 1, v);
    return;
  }
  long long n = llround(v);
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%lld", n < 0 ? -n : n);
  size_t l = strlen(tmp), o = 0;
  if (n < 0 && o + 1 < len)
    buf[o++] = '-';
  for (size_t i = 0; i < l && o + 2 < len; i++) {
    if (i && (l - i) % 3 == 0)
      buf[o++] = ',';
    buf[o++] = tmp[i];
  }
  buf[o] = '\0';
}

void cap_svg_begin(FILE *f, const char *title, const char *subtitle) {
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" "
          "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
          "font-family=\"%s\">\n",
          CAP_SVG_W, CAP_SVG_H, CAP_SVG_W, CAP_SVG_H, FONT);
  fputs("<title>", f);
  cap_svg_text(f, title);
  fputs("</title>\n", f);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", CAP_SVG_W,
          CAP_SVG_H);
  fprintf(f,
          "<text x=\"%d\" y=\"34\" font-size=\"21\" font-weight=\"bold\" "
          "fill=\"#202124\">",
          CAP_SVG_ML);
  cap_svg_text(f, title);
  fputs("</text>\n", f);
  if (subtitle) {
    fprintf(f, "<text x=\"%d\" y=\"58\" font-size=\"13.5\" fill=\"#5f6368\">",
            CAP_SVG_ML);
    cap_svg_text(f, subtitle);
    fputs("</text>\n", f);
  }
}

void cap_svg_grid(FILE *f, const cap_svg_scale_t *s, const char *xtitle,
                  const char *ytitle) {
  char a[32];
  const int ml = CAP_SVG_ML, mt = CAP_SVG_MT, pw = CAP_SVG_PW, ph = CAP_SVG_PH;
  fputs("<g font-size=\"12\" fill=\"#5f6368\">\n", f);
  for (double v = 0; v <= s->ymax + s->ystep * 1e-6; v += s->ystep) {
    double y = cap_svg_y(s, v);
    cap_svg_num(a, sizeof a, v);
    fprintf(f,
            "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"1\"/>\n"
            "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
            ml, y, ml + pw, y, v == 0 ? "#9aa0a6" : "#eceff1", ml - 8, y + 4, a);
  }
  for (double v = 0; v <= s->xmax + s->xstep * 1e-6; v += s->xstep) {
    double x = cap_svg_x(s, v);
    cap_svg_num(a, sizeof a, v);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" "
            "stroke-width=\"1\"/>\n"
            "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
            "stroke=\"#9aa0a6\"/>\n"
            "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
            x, mt, x, mt + ph, v == 0 ? "#9aa0a6" : "#eceff1", x, mt + ph, x,
            mt + ph + 5, x, mt + ph + 20, a);
  }
  fprintf(f,
          "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13.5\" "
          "fill=\"#3c4043\">",
          ml + pw / 2, CAP_SVG_H - 22);
  cap_svg_text(f, xtitle);
  fprintf(f,
          "</text>\n<text transform=\"translate(28 %d) rotate(-90)\" "
          "text-anchor=\"middle\" font-size=\"13.5\" fill=\"#3c4043\">",
          mt + ph / 2);
  cap_svg_text(f, ytitle);
  fputs("</text>\n</g>\n", f);
}

void cap_svg_hline(FILE *f, const cap_svg_scale_t *s, double yv,
                   const char *color, const char *label) {
  double y = cap_svg_y(s, yv);
  fprintf(f,
          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
          "stroke-width=\"2\" stroke-dasharray=\"9 5\"/>\n"
          "<text x=\"%d\" y=\"%.1f\" font-size=\"12.5\" font-weight=\"bold\" "
          "fill=\"%s\" " CAP_SVG_HALO ">",
          CAP_SVG_ML, y, CAP_SVG_ML + CAP_SVG_PW, y, color, CAP_SVG_ML + 8,
          y - 7, color);
  cap_svg_text(f, label);
  fputs("</text>\n", f);
}
