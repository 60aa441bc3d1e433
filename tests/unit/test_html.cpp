// Reports: every input string escaped, pages self-contained, charts present, same bytes for
// the same data.
#include <gtest/gtest.h>

#include <string>

#include "reports/csv.hpp"
#include "reports/html.hpp"
#include "reports/markdown.hpp"

namespace dtsim {
namespace {

const std::string kEvil = "<script>alert('x')</script> & \"quoted\" | *bold* [link](http://evil.example)";

ReportData sample() {
  ReportData r;
  r.kind = "sweep";
  r.title = kEvil;
  r.source = "/tmp/" + kEvil + ".yaml";
  r.summary = {{kEvil, kEvil}};
  r.notes = {kEvil};
  r.tables.push_back({kEvil, {kEvil, "b"}, {{kEvil, "1"}, {"x", kEvil}}});
  ScatterChart s;
  s.title = kEvil;
  s.x_label = kEvil;
  s.y_label = "tokens/s";
  s.log_x = true;
  s.points = {{kEvil, 8, 100, false}, {"b", 64, 700, true}, {"c", 1024, 9000, false}};
  s.line = {{"b", 64, 700, false}, {"c", 1024, 9000, false}};
  r.scatters.push_back(s);
  StackedBarChart b;
  b.title = "memory";
  b.y_label = "GiB";
  b.series = {kEvil, "grads"};
  b.bars = {kEvil, "stage 1"};
  b.values = {{10, 20}, {5, 30}};
  b.limit = 78;
  b.limit_label = kEvil;
  r.bars.push_back(b);
  TimelineChart t;
  t.title = "timeline";
  t.lanes = {kEvil, "stage 1"};
  t.events = {{0, 0, 1, "forward", kEvil}, {1, 1, 2, "backward", "b"}};
  r.timeline = t;
  return r;
}

TEST(HtmlReport, EscapesEveryInputString) {
  const std::string h = render_html(sample());
  EXPECT_EQ(h.find("<script>alert"), std::string::npos);
  EXPECT_EQ(h.find("'x'"), std::string::npos);
  EXPECT_NE(h.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quoted&quot;"), std::string::npos);
  EXPECT_EQ(html_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(HtmlReport, SelfContainedWithInlineCharts) {
  const std::string h = render_html(sample());
  // No external resource: nothing is loaded from a URL (the only "http" is the SVG
  // namespace name and the escaped input text), and a CSP forbids fetches.
  EXPECT_EQ(h.find(" src="), std::string::npos);
  EXPECT_EQ(h.find("<link"), std::string::npos);
  EXPECT_EQ(h.find("url("), std::string::npos);
  EXPECT_NE(h.find("Content-Security-Policy"), std::string::npos);
  EXPECT_NE(h.find("default-src 'none'"), std::string::npos);
  // Three charts (scatter, bars, timeline), each an inline SVG with marks.
  size_t n = 0;
  for (size_t p = h.find("<svg class=\"chart\""); p != std::string::npos; p = h.find("<svg class=\"chart\"", p + 1)) ++n;
  EXPECT_EQ(n, 3u);
  EXPECT_NE(h.find("<polyline"), std::string::npos);
  EXPECT_NE(h.find("<circle"), std::string::npos);
  EXPECT_NE(h.find("stroke-dasharray"), std::string::npos);  // the capacity line
  EXPECT_EQ(render_html(sample()), h);                       // deterministic
}

TEST(HtmlReport, EmptyChartsStillRender) {
  ScatterChart s;
  s.title = "nothing";
  const std::string svg = svg_scatter(s);
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(MarkdownReport, EscapesTablesAndMarkup) {
  const std::string md = render_markdown(sample());
  EXPECT_EQ(md.find("<script>"), std::string::npos);
  EXPECT_EQ(md.find("| *bold*"), std::string::npos);
  EXPECT_NE(md.find("\\<script\\>"), std::string::npos);
  EXPECT_NE(md.find("\\| \\*bold\\* \\[link\\]\\(http://evil.example\\)"), std::string::npos);
  EXPECT_EQ(markdown_escape("a|b\nc"), "a\\|b c");
}

TEST(CsvReport, QuotesFieldsPerRfc4180) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\"\n"), "\"say \"\"hi\"\"\n\"");
  // Formula-like text is neutralised (OWASP CSV Injection); numbers are left alone.
  EXPECT_EQ(csv_field("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
  EXPECT_EQ(csv_field("@SUM(A1)"), "'@SUM(A1)");
  EXPECT_EQ(csv_field("+cmd"), "'+cmd");
  EXPECT_EQ(csv_field("-x"), "'-x");
  EXPECT_EQ(csv_field("-1.5e-3"), "-1.5e-3");
  EXPECT_EQ(csv_field("+2"), "+2");
  EXPECT_EQ(csv_field("-59.9%"), "-59.9%");  // compare.csv deltas stay numeric
  EXPECT_EQ(csv_field("+0.0%"), "+0.0%");
  EXPECT_EQ(csv_field("-5%x"), "'-5%x");
  EXPECT_EQ(csv_field("-"), "'-");
  EXPECT_EQ(csv_field(""), "");
  EXPECT_EQ(csv_line({"=1+1", "-7"}), "'=1+1,-7\n");
  EXPECT_EQ(csv_number(0), "0");
  EXPECT_EQ(csv_number(1.0 / 3.0), "0.333333333");
  SweepRow r;
  r.cluster_label = "8 x DGX, nic=200 Gb/s";
  r.status = "invalid";
  r.reason = "layout.tp=3 does not divide model.heads=64";
  const std::string line = sweep_csv_line(r);
  EXPECT_NE(line.find("\"8 x DGX, nic=200 Gb/s\""), std::string::npos);
  size_t commas = 0;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    if (c == ',' && !quoted) ++commas;
  }
  EXPECT_EQ(commas + 1, sweep_csv_columns().size());
}

}  // namespace
}  // namespace dtsim
