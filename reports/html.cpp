#include "reports/html.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace dtsim {

namespace {

constexpr double kW = 720, kH = 340;                  // chart size, px
constexpr double kL = 78, kR = 150, kT = 34, kB = 52;  // margins (legend on the right)
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string num(double v) { return fmt::format("{:.2f}", v); }

/// "Nice" axis ticks covering [lo, hi] (Heckbert 1990, "Nice numbers for graph labels").
std::vector<double> ticks(double lo, double hi, int target = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const double range = hi - lo;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.4g}", v);
}

/// Widths of text, px, estimated per character (no font metrics offline): 0.6 em, about
/// the widest average advance of the sans-serif faces the page asks for (bold included),
/// so an estimate errs on the wide side.
double text_width(const std::string& s, double font_px) { return static_cast<double>(s.size()) * 0.6 * font_px; }
constexpr double kTitlePx = 14, kTickPx = 11, kTitleX = 10, kTitleLine = 18;

/// `title` split at spaces into lines that fit the chart width.
std::vector<std::string> wrap_title(const std::string& title) {
  const double room = kW - 2 * kTitleX;
  std::vector<std::string> lines;
  std::string cur;
  size_t i = 0;
  while (i <= title.size()) {
    const size_t sp = std::min(title.find(' ', i), title.size());
    const std::string word = title.substr(i, sp - i);
    const std::string cand = cur.empty() ? word : cur + " " + word;
    if (!cur.empty() && text_width(cand, kTitlePx) > room) {
      lines.push_back(cur);
      cur = word;
    } else {
      cur = cand;
    }
    // A single word wider than the chart is cut into pieces that fit.
    const size_t fit = static_cast<size_t>(room / (0.6 * kTitlePx));
    while (cur.size() > fit) {
      lines.push_back(cur.substr(0, fit));
      cur = cur.substr(fit);
    }
    i = sp + 1;
  }
  if (!cur.empty() || lines.empty()) lines.push_back(cur);
  return lines;
}

/// The SVG header and title. The chart body is drawn in a kW x kH frame; a title of more
/// than one line moves it down, and `extra_bottom` px are added below it (rotated labels).
/// Close with close_svg().
std::string open_svg(const std::string& title, double extra_bottom = 0) {
  const std::vector<std::string> lines = wrap_title(title);
  const double dy = static_cast<double>(lines.size() - 1) * kTitleLine;
  const double h = kH + dy + extra_bottom;
  std::string s = fmt::format(
      "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" "
      "role=\"img\" aria-label=\"{}\">\n<text x=\"{}\" y=\"20\" class=\"ct\">",
      kW, num(h), kW, num(h), html_escape(title), num(kTitleX));
  for (size_t i = 0; i < lines.size(); ++i)
    s += fmt::format("<tspan x=\"{}\" dy=\"{}\">{}</tspan>", num(kTitleX), i == 0 ? "0" : num(kTitleLine),
                     html_escape(lines[i]));
  s += "</text>\n";
  s += fmt::format("<g transform=\"translate(0 {})\">\n", num(dy));
  return s;
}

std::string close_svg() { return "</g></svg>\n"; }

/// Every how many-th of `n` labels `step` px apart to draw so that `need` px each do not
/// overlap.
size_t label_stride(double step, double need) {
  if (step <= 0) return 1;
  return std::max<size_t>(1, static_cast<size_t>(std::ceil(need / step - 1e-9)));
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double px0 = 0, px1 = 1;
  double map(double v) const {
    const double a = log ? std::log10(std::max(v, 1e-300)) : v;
    const double l = log ? std::log10(std::max(lo, 1e-300)) : lo;
    const double h = log ? std::log10(std::max(hi, 1e-300)) : hi;
    return px0 + (a - l) / (h - l) * (px1 - px0);
  }
};

std::string axes(const Axis& x, const Axis& y, const std::string& xl, const std::string& yl) {
  std::string s;
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ax\"/>\n", num(kL), num(kH - kB), num(kW - kR),
                   num(kH - kB));
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ax\"/>\n", num(kL), num(kT), num(kL),
                   num(kH - kB));
  std::vector<double> xt;
  if (x.log) {
    for (double v = std::pow(2.0, std::floor(std::log2(std::max(x.lo, 1e-300)))); v <= x.hi * 1.0001; v *= 2)
      if (v >= x.lo * 0.9999) xt.push_back(v);
    while (xt.size() > 8) {
      std::vector<double> thin;
      for (size_t i = 0; i < xt.size(); i += 2) thin.push_back(xt[i]);
      xt = thin;
    }
  } else {
    xt = ticks(x.lo, x.hi);
  }
  for (double v : xt) {
    if (v < x.lo - 1e-12 || v > x.hi + 1e-12) continue;
    const double px = x.map(v);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" class=\"gr\"/><text x=\"{0}\" y=\"{3}\" "
                     "class=\"tk\" text-anchor=\"middle\">{4}</text>\n",
                     num(px), num(kT), num(kH - kB), num(kH - kB + 16), html_escape(tick_label(v)));
  }
  for (double v : ticks(y.lo, y.hi)) {
    if (v < y.lo - 1e-12 || v > y.hi + 1e-12) continue;
    const double py = y.map(v);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"gr\"/><text x=\"{3}\" y=\"{4}\" "
                     "class=\"tk\" text-anchor=\"end\">{5}</text>\n",
                     num(kL), num(py), num(kW - kR), num(kL - 6), num(py + 4), html_escape(tick_label(v)));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"al\" text-anchor=\"middle\">{}</text>\n", num((kL + kW - kR) / 2),
                   num(kH - 12), html_escape(xl));
  s += fmt::format("<text x=\"16\" y=\"{0}\" class=\"al\" text-anchor=\"middle\" transform=\"rotate(-90 16 {0})\">{1}</text>\n",
                   num((kT + kH - kB) / 2), html_escape(yl));
  return s;
}

std::string legend(const std::vector<std::string>& names, const std::vector<std::string>& colors) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    const double y = kT + 8 + static_cast<double>(i) * 18;
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" "
                     "class=\"tk\">{}</text>\n",
                     num(kW - kR + 12), num(y), colors[i], num(kW - kR + 30), num(y + 10), html_escape(names[i]));
  }
  return s;
}

std::string empty_note() {
  return fmt::format("<text x=\"{}\" y=\"{}\" class=\"tk\" text-anchor=\"middle\">no data</text>\n",
                     num((kL + kW - kR) / 2), num(kH / 2));
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_scatter(const ScatterChart& c) {
  std::string s = open_svg(c.title);
  std::vector<ChartPoint> all = c.points;
  all.insert(all.end(), c.line.begin(), c.line.end());
  if (all.empty()) return s + empty_note() + "<rect x=\"0\" y=\"0\" width=\"1\" height=\"1\" fill=\"none\"/>" + close_svg();
  double x0 = all[0].x, x1 = all[0].x, y1 = all[0].y;
  for (const auto& p : all) {
    x0 = std::min(x0, p.x);
    x1 = std::max(x1, p.x);
    y1 = std::max(y1, p.y);
  }
  Axis x{x0, x1, c.log_x, kL, kW - kR}, y{0, y1 > 0 ? y1 * 1.08 : 1, false, kH - kB, kT};
  if (c.log_x) {
    x.lo = x0 / 1.3;
    x.hi = x1 * 1.3;
  } else {
    const double pad = (x1 - x0) * 0.05 + (x1 == x0 ? std::max(1.0, std::abs(x0) * 0.1) : 0.0);
    x.lo = x0 - pad;
    x.hi = x1 + pad;
    if (x0 >= 0 && x.lo < 0) x.lo = 0;
  }
  s += axes(x, y, c.x_label, c.y_label);
  for (const auto& p : c.points)
    s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{}\" fill-opacity=\"{}\"><title>{}</title></circle>\n",
                     num(x.map(p.x)), num(y.map(p.y)), p.highlight ? "5" : "3", p.highlight ? kPalette[3] : kPalette[0],
                     p.highlight ? "1" : "0.55", html_escape(p.label));
  if (!c.line.empty()) {
    std::string pts;
    for (const auto& p : c.line) pts += num(x.map(p.x)) + "," + num(y.map(p.y)) + " ";
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, kPalette[1]);
    for (const auto& p : c.line)
      s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\"><title>{}</title></circle>\n", num(x.map(p.x)),
                       num(y.map(p.y)), kPalette[1], html_escape(p.label));
  }
  return s + close_svg();
}

std::string svg_stacked_bars(const StackedBarChart& c) {
  // Bar labels: horizontal when the widest fits its slot, else vertical (rotated -90 deg,
  // reading upwards, ending under the bar) with the chart extended below; labels that still
  // crowd are thinned. A label cut to fit keeps its end (cluster labels differ there).
  constexpr size_t kMaxLabel = 32;
  const double n = std::max<double>(1.0, static_cast<double>(c.bars.size()));
  const double slot = (kW - kR - kL) / n;
  std::vector<std::string> labels;
  double widest = 0;
  for (const auto& b : c.bars) {
    labels.push_back(b.size() > kMaxLabel ? "~" + b.substr(b.size() - (kMaxLabel - 1)) : b);
    widest = std::max(widest, text_width(labels.back(), kTickPx));
  }
  const bool vertical = widest > slot - 4;
  const double label_top = kH - kB + 8;  // where a vertical label ends (its right end)
  const double extra_bottom = vertical ? std::max(0.0, label_top + widest + 6 - kH) : 0.0;
  const size_t label_every = label_stride(slot, vertical ? kTickPx * 1.3 : widest + 4);

  std::string s = open_svg(c.title, extra_bottom);
  if (c.bars.empty()) return s + empty_note() + "<rect x=\"0\" y=\"0\" width=\"1\" height=\"1\" fill=\"none\"/>" + close_svg();
  double top = c.limit;
  for (double l : c.bar_limits) top = std::max(top, l);
  for (const auto& v : c.values) {
    double sum = 0;
    for (double x : v) sum += std::max(0.0, x);
    top = std::max(top, sum);
  }
  Axis y{0, top > 0 ? top * 1.08 : 1, false, kH - kB, kT};
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ax\"/>\n", num(kL), num(kH - kB), num(kW - kR),
                   num(kH - kB));
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ax\"/>\n", num(kL), num(kT), num(kL), num(kH - kB));
  for (double v : ticks(y.lo, y.hi)) {
    const double py = y.map(v);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" class=\"gr\"/><text x=\"{3}\" y=\"{4}\" "
                     "class=\"tk\" text-anchor=\"end\">{5}</text>\n",
                     num(kL), num(py), num(kW - kR), num(kL - 6), num(py + 4), html_escape(tick_label(v)));
  }
  s += fmt::format("<text x=\"16\" y=\"{0}\" class=\"al\" text-anchor=\"middle\" transform=\"rotate(-90 16 {0})\">{1}</text>\n",
                   num((kT + kH - kB) / 2), html_escape(c.y_label));
  const double bw = std::max(2.0, slot * 0.7);
  std::vector<std::string> colors;
  for (size_t k = 0; k < c.series.size(); ++k) colors.push_back(kPalette[k % 10]);
  for (size_t b = 0; b < c.bars.size(); ++b) {
    const double x = kL + slot * static_cast<double>(b) + (slot - bw) / 2;
    double acc = 0;
    for (size_t k = 0; k < c.series.size() && k < c.values[b].size(); ++k) {
      const double v = std::max(0.0, c.values[b][k]);
      if (v <= 0) continue;
      const double y0 = y.map(acc), y1 = y.map(acc + v);
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: {} {}</title></rect>\n",
                       num(x), num(y1), num(bw), num(std::max(0.5, y0 - y1)), colors[k], html_escape(c.bars[b]),
                       html_escape(c.series[k]), html_escape(tick_label(v)));
      acc += v;
    }
    if (b < c.bar_limits.size() && c.bar_limits[b] > 0) {
      const double py = y.map(c.bar_limits[b]);
      s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"lim\" stroke=\"#c00\" stroke-width=\"2\" "
                       "stroke-dasharray=\"6 4\"><title>{}: {} {}</title></line>\n",
                       num(x - (slot - bw) / 4), num(py), num(x + bw + (slot - bw) / 4), num(py), html_escape(c.bars[b]),
                       html_escape(c.limit_label), html_escape(tick_label(c.bar_limits[b])));
    }
    if (b % label_every != 0) continue;
    const double cx = x + bw / 2;
    if (vertical)
      s += fmt::format("<text x=\"{0}\" y=\"{1}\" class=\"tk\" text-anchor=\"end\" transform=\"rotate(-90 {0} {1})\" "
                       "dy=\"{2}\">{3}</text>\n",
                       num(cx), num(label_top), num(kTickPx * 0.35), html_escape(labels[b]));
    else
      s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tk\" text-anchor=\"middle\">{}</text>\n", num(cx),
                       num(kH - kB + 16), html_escape(labels[b]));
  }
  if (c.limit > 0) {
    const double py = y.map(c.limit);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#c00\" stroke-dasharray=\"6 4\"/>"
                     "<text x=\"{2}\" y=\"{3}\" class=\"tk\" text-anchor=\"end\" fill=\"#c00\">{4}</text>\n",
                     num(kL), num(py), num(kW - kR), num(py - 4), html_escape(c.limit_label));
  }
  std::vector<std::string> names = c.series;
  if (!c.bar_limits.empty() && c.limit <= 0) {
    // The per-bar limit marks in the legend: a dashed red line and its label.
    const double ly = kT + 8 + static_cast<double>(names.size()) * 18 + 6;
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"2\" "
                     "stroke-dasharray=\"4 3\"/><text x=\"{}\" y=\"{}\" class=\"tk\">limit</text>\n",
                     num(kW - kR + 10), num(ly), num(kW - kR + 26), num(ly), num(kW - kR + 30), num(ly + 4));
  }
  s += legend(names, colors);
  return s + close_svg();
}

std::string svg_timeline(const TimelineChart& c) {
  std::string s = open_svg(c.title);
  if (c.events.empty() || c.lanes.empty())
    return s + empty_note() + "<rect x=\"0\" y=\"0\" width=\"1\" height=\"1\" fill=\"none\"/>" + close_svg();
  double t1 = 0;
  for (const auto& e : c.events) t1 = std::max(t1, e.start + e.duration);
  Axis x{0, t1 > 0 ? t1 : 1, false, kL, kW - kR};
  const double lane_h = std::min(28.0, (kH - kB - kT) / static_cast<double>(c.lanes.size()));
  s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ax\"/>\n", num(kL), num(kH - kB), num(kW - kR),
                   num(kH - kB));
  for (double v : ticks(0, x.hi)) {
    const double px = x.map(v);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" class=\"gr\"/><text x=\"{0}\" y=\"{3}\" "
                     "class=\"tk\" text-anchor=\"middle\">{4}</text>\n",
                     num(px), num(kT), num(kH - kB), num(kH - kB + 16), html_escape(tick_label(v)));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"al\" text-anchor=\"middle\">{}</text>\n", num((kL + kW - kR) / 2),
                   num(kH - 12), html_escape(c.x_label));
  // Lane names thinned when lanes are lower than a line of text.
  const size_t lane_every = label_stride(lane_h, kTickPx * 1.2);
  for (size_t i = 0; i < c.lanes.size(); i += lane_every)
    s += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tk\" text-anchor=\"end\">{}</text>\n", num(kL - 6),
                     num(kT + lane_h * (static_cast<double>(i) + 0.5) + 4), html_escape(c.lanes[i]));
  std::vector<std::string> kinds;
  for (const auto& e : c.events)
    if (std::find(kinds.begin(), kinds.end(), e.kind) == kinds.end()) kinds.push_back(e.kind);
  std::vector<std::string> colors;
  for (size_t k = 0; k < kinds.size(); ++k) colors.push_back(kPalette[k % 10]);
  for (const auto& e : c.events) {
    const size_t k = static_cast<size_t>(std::find(kinds.begin(), kinds.end(), e.kind) - kinds.begin());
    const double x0 = x.map(e.start), x1 = x.map(e.start + e.duration);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\" stroke-width=\"0.5\">"
                     "<title>{}</title></rect>\n",
                     num(x0), num(kT + lane_h * e.lane + 2), num(std::max(0.5, x1 - x0)), num(lane_h - 4), colors[k],
                     html_escape(e.label));
  }
  s += legend(kinds, colors);
  return s + close_svg();
}

std::string render_html(const ReportData& r) {
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
       "script-src 'unsafe-inline'; img-src data:\">\n";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += "<title>" + html_escape("dtsim " + r.kind + ": " + r.title) + "</title>\n";
  h += "<style>\n"
       "body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}\n"
       "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}\n"
       ".src{color:#666;font-size:13px}\n"
       "table{border-collapse:collapse;font-size:12.5px;margin:6px 0}th,td{border:1px solid #ddd;padding:3px 7px;"
       "text-align:right;white-space:nowrap}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}\n"
       "dl.sum{display:grid;grid-template-columns:max-content auto;gap:2px 14px;font-size:14px}dt{color:#555}dd{margin:0}\n"
       ".charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{border:1px solid #e4e4e4;background:#fff}\n"
       "svg .ct{font-size:14px;font-weight:600}svg .tk{font-size:11px;fill:#444}svg .al{font-size:12px;fill:#222}\n"
       "svg .ax{stroke:#333;stroke-width:1}svg .gr{stroke:#eee;stroke-width:1}\n"
       "ul.notes{font-size:13px;color:#444}.scroll{overflow-x:auto}\n"
       "</style>\n</head>\n<body data-charts-drawn=\"pending\">\n";
  h += "<h1>" + html_escape(r.title) + "</h1>\n";
  h += "<div class=\"src\">dtsim " + html_escape(r.kind) + " report" +
       (r.source.empty() ? std::string() : " &middot; " + html_escape(r.source)) + "</div>\n";
  if (!r.summary.empty()) {
    h += "<h2>Summary</h2>\n<dl class=\"sum\">\n";
    for (const auto& [k, v] : r.summary) h += "<dt>" + html_escape(k) + "</dt><dd>" + html_escape(v) + "</dd>\n";
    h += "</dl>\n";
  }
  h += "<h2>Charts</h2>\n<div class=\"charts\">\n";
  for (const auto& c : r.scatters) h += svg_scatter(c);
  for (const auto& c : r.bars) h += svg_stacked_bars(c);
  if (r.timeline) h += svg_timeline(*r.timeline);
  h += "</div>\n";
  for (const auto& t : r.tables) {
    h += "<h2>" + html_escape(t.caption) + "</h2>\n<div class=\"scroll\"><table>\n<tr>";
    for (const auto& c : t.columns) h += "<th>" + html_escape(c) + "</th>";
    h += "</tr>\n";
    for (const auto& row : t.rows) {
      h += "<tr>";
      for (const auto& cell : row) h += "<td>" + html_escape(cell) + "</td>";
      h += "</tr>\n";
    }
    h += "</table></div>\n";
  }
  if (!r.notes.empty()) {
    h += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const auto& n : r.notes) h += "<li>" + html_escape(n) + "</li>\n";
    h += "</ul>\n";
  }
  // Self-check after load (read by the Chromium test): charts have a drawn extent.
  h += "<script>\n"
       "(function(){var errs=[];window.addEventListener('error',function(e){errs.push(String(e.message));"
       "document.body.setAttribute('data-js-errors',errs.join(' | '));});\n"
       "window.addEventListener('load',function(){var c=document.querySelectorAll('svg.chart'),ok=0;"
       "for(var i=0;i<c.length;i++){var b=c[i].getBBox();var marks=c[i].querySelectorAll('rect,circle,polyline')"
       ".length;if(b.width>0&&b.height>0&&marks>0)ok++;}"
       "document.body.setAttribute('data-charts-drawn',ok+'/'+c.length);});})();\n"
       "</script>\n</body>\n</html>\n";
  return h;
}

}  // namespace dtsim
