#pragma once
// A ReportData (reports/html.hpp) as GitHub-flavoured Markdown: summary, tables, notes, and
// each chart's data as a small table (Markdown has no charts). Input strings are escaped
// (markdown_escape) so that a cluster name cannot break a table or inject markup.
#include <string>

#include "reports/html.hpp"

namespace dtsim {

/// Backslash-escapes Markdown punctuation (\ ` * _ { } [ ] < > ( ) # + - ! |) and turns
/// newlines into spaces.
std::string markdown_escape(const std::string& s);

std::string render_markdown(const ReportData& r);

}  // namespace dtsim
