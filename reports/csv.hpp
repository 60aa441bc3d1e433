#pragma once
// CSV output (RFC 4180): fields with a comma, quote, CR or LF are quoted, quotes doubled.
// A text field a spreadsheet would run as a formula (first character =, +, -, @, tab or CR,
// and not a number) gets a leading ' (OWASP "CSV Injection" recommendation); numbers and
// percentages such as -1.5 or +0.0% are written as they are.
// Numbers use a fixed format ({:.9g}) so the same result gives the same bytes.
#include <string>
#include <vector>

#include "models/sweep_spec.hpp"

namespace dtsim {

/// One field, quoted when needed (RFC 4180 Sec 2), formula-like text prefixed with '.
std::string csv_field(const std::string& s);
/// A number as written in every dtsim CSV: {:.9g}; non-finite values as empty fields.
std::string csv_number(double v);
/// Fields joined by commas, with a trailing "\n".
std::string csv_line(const std::vector<std::string>& fields);

/// The sweep CSV columns (docs: README "Sweeps, comparisons and capacity plans").
const std::vector<std::string>& sweep_csv_columns();
std::string sweep_csv_header();
/// One row, columns as sweep_csv_columns(); memory in GiB.
std::string sweep_csv_line(const SweepRow& r);

/// A table as CSV: header then rows (each row as many fields as columns).
std::string csv_table(const std::vector<std::string>& columns, const std::vector<std::vector<std::string>>& rows);

}  // namespace dtsim
