#pragma once
// Reports of sweep, compare and plan as one plain-data ReportData, rendered to a
// self-contained HTML page (this file) or Markdown (reports/markdown.hpp).
//
// The HTML opens offline: no external file, font or script; charts are inline SVG drawn
// here (no JavaScript needed to draw them); a Content-Security-Policy forbids any fetch.
// A few lines of inline script only check the page after it loaded: every `svg.chart` has a
// non-empty bounding box, recorded as body[data-charts-drawn="ok/total"], and script errors
// as body[data-js-errors] (tests/slow/test_html_chromium.cpp reads both). Every string that
// comes from an input (titles, cluster names, reasons) is escaped (html_escape).
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtsim {

struct ReportTable {
  std::string caption;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

struct ChartPoint {
  std::string label;  // tooltip
  double x = 0, y = 0;
  bool highlight = false;
};

/// Scatter plot with an optional polyline (e.g. the Pareto front, the best per GPU count).
struct ScatterChart {
  std::string title, x_label, y_label;
  std::vector<ChartPoint> points;
  std::vector<ChartPoint> line;
  bool log_x = false;
};

/// Stacked bars: values[bar][series]; an optional horizontal limit line (e.g. HBM capacity)
/// across the chart, and/or one limit per bar (bar_limits[bar], e.g. each cluster's own HBM)
/// drawn as a dashed mark over that bar.
struct StackedBarChart {
  std::string title, y_label;
  std::vector<std::string> series;
  std::vector<std::string> bars;
  std::vector<std::vector<double>> values;
  double limit = 0;
  std::string limit_label;
  std::vector<double> bar_limits;  // empty, or one per bar (0: none)
};

/// Lanes of time intervals (a pipeline schedule excerpt).
struct TimelineChart {
  struct Event {
    int lane = 0;
    double start = 0, duration = 0;
    std::string kind;   // colour key: "forward", "backward", "comm", ...
    std::string label;  // tooltip
  };
  std::string title, x_label;
  std::vector<std::string> lanes;
  std::vector<Event> events;
};

struct ReportData {
  std::string kind;   // "sweep", "compare", "plan"
  std::string title;
  std::string source;  // input file
  std::vector<std::pair<std::string, std::string>> summary;  // label, value
  std::vector<std::string> notes;
  std::vector<ReportTable> tables;
  std::vector<ScatterChart> scatters;
  std::vector<StackedBarChart> bars;
  std::optional<TimelineChart> timeline;
};

/// &, <, >, ", ' as character references (safe in text and quoted attributes).
std::string html_escape(const std::string& s);

/// The whole page. Deterministic: same data, same bytes.
std::string render_html(const ReportData& r);

/// The SVG of one chart (class "chart"), for tests.
std::string svg_scatter(const ScatterChart& c);
std::string svg_stacked_bars(const StackedBarChart& c);
std::string svg_timeline(const TimelineChart& c);

}  // namespace dtsim
