#include "reports/markdown.hpp"

#include <fmt/format.h>

namespace dtsim {

namespace {

std::string table(const std::vector<std::string>& cols, const std::vector<std::vector<std::string>>& rows) {
  std::string s = "|";
  for (const auto& c : cols) {
    s += ' ';
    s += markdown_escape(c);
    s += " |";
  }
  s += "\n|";
  for (size_t i = 0; i < cols.size(); ++i) s += i == 0 ? " --- |" : " ---: |";
  s += "\n";
  for (const auto& r : rows) {
    s += "|";
    for (const auto& c : r) {
      s += ' ';
      s += markdown_escape(c);
      s += " |";
    }
    s += "\n";
  }
  return s;
}

std::string g(double v) { return fmt::format("{:.4g}", v); }

}  // namespace

std::string markdown_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '\\': case '`': case '*': case '_': case '{': case '}': case '[': case ']': case '<': case '>':
      case '(': case ')': case '#': case '+': case '-': case '!': case '|':
        out += '\\';
        out += c;
        break;
      case '\n': case '\r': out += ' '; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_markdown(const ReportData& r) {
  std::string s = "# " + markdown_escape(r.title) + "\n\n";
  s += "dtsim " + markdown_escape(r.kind) + " report" + (r.source.empty() ? "" : ", " + markdown_escape(r.source)) + "\n\n";
  if (!r.summary.empty()) {
    s += "## Summary\n\n";
    std::vector<std::vector<std::string>> rows;
    for (const auto& [k, v] : r.summary) rows.push_back({k, v});
    s += table({"", "value"}, rows) + "\n";
  }
  for (const auto& t : r.tables) s += "## " + markdown_escape(t.caption) + "\n\n" + table(t.columns, t.rows) + "\n";
  for (const auto& c : r.scatters) {
    s += "## " + markdown_escape(c.title) + "\n\n";
    std::vector<std::vector<std::string>> rows;
    const auto& pts = c.line.empty() ? c.points : c.line;
    for (size_t i = 0; i < pts.size() && i < 40; ++i) rows.push_back({pts[i].label, g(pts[i].x), g(pts[i].y)});
    s += table({"point", c.x_label, c.y_label}, rows);
    if (pts.size() > 40) s += "\n(" + std::to_string(pts.size() - 40) + " more in the HTML report)\n";
    s += "\n";
  }
  for (const auto& c : r.bars) {
    s += "## " + markdown_escape(c.title) + "\n\n";
    std::vector<std::string> cols = {""};
    cols.insert(cols.end(), c.series.begin(), c.series.end());
    if (!c.bar_limits.empty()) cols.push_back(c.limit_label);
    std::vector<std::vector<std::string>> rows;
    for (size_t b = 0; b < c.bars.size(); ++b) {
      std::vector<std::string> row = {c.bars[b]};
      for (size_t k = 0; k < c.series.size(); ++k) row.push_back(k < c.values[b].size() ? g(c.values[b][k]) : "");
      if (!c.bar_limits.empty()) row.push_back(b < c.bar_limits.size() ? g(c.bar_limits[b]) : "");
      rows.push_back(row);
    }
    s += table(cols, rows);
    if (c.limit > 0) s += "\n" + markdown_escape(c.limit_label) + ": " + g(c.limit) + " " + markdown_escape(c.y_label) + "\n";
    s += "\n";
  }
  if (!r.notes.empty()) {
    s += "## Notes\n\n";
    for (const auto& n : r.notes) s += "- " + markdown_escape(n) + "\n";
  }
  return s;
}

}  // namespace dtsim
