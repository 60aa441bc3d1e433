#pragma once
// Fast writers and readers of one SweepRow, for the sweep's per-row and final outputs
// (no JSON document is built; each function appends to a caller's buffer):
//
//  - the compact journal record (OUT/journal.jsonl, format 2): one JSON array per row, the
//    fields in journal_columns() order (the keys of to_json(SweepRow), in that order), no
//    spaces; integers in decimal, doubles shortest round-trip (std::to_chars, so a resumed or
//    merged row holds exactly the bits that were computed; non-finite ones as the strings
//    "inf", "-inf", "nan"), text JSON-escaped. Every line is still one JSON value.
//  - a row of sweep.json: byte for byte what to_json(row).dump(1) writes at that depth
//    (keys sorted, nlohmann's number and string formatting);
//  - a line of results.csv / ranked.csv: byte for byte sweep_csv_line(row) (reports/csv.hpp).
#include <string>
#include <string_view>
#include <vector>

#include "models/sweep_spec.hpp"

namespace dtsim::sweep {

/// The journal record's fields, in order (40 names, the to_json(SweepRow) keys).
const std::vector<std::string>& journal_columns();

/// Appends the compact record of `r` and a "\n".
void append_journal_record(std::string& out, const SweepRow& r);

/// Parses one record line (without its "\n"). Returns false and sets `error` (which field,
/// what was expected) when the line is not a record of journal_columns().
bool parse_journal_record(std::string_view line, SweepRow& r, std::string& error);

/// JSON text as nlohmann::json::dump writes it (ensure_ascii off; invalid UTF-8 throws as
/// there). Appends the quoted, escaped string.
void append_json_string(std::string& out, std::string_view s);
/// A double as nlohmann::json::dump writes it (Grisu2, "null" when not finite).
void append_json_double(std::string& out, double v);

/// Appends to_json(r).dump(1) as written at nesting depth `depth` (the object's members are
/// indented by depth + 1 spaces, its closing brace by depth).
void append_row_json(std::string& out, const SweepRow& r, int depth);

/// Appends sweep_csv_line(r).
void append_csv_line(std::string& out, const SweepRow& r);
/// Appends csv_number(v).
void append_csv_number(std::string& out, double v);

}  // namespace dtsim::sweep
