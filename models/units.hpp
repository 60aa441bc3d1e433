#pragma once
// Quantities with units, as written in experiment files: "450 GB/s", "1.5 us", "80 GiB",
// "312 TFLOP/s". Every parser returns SI base units (B/s, s, bytes, FLOP/s).
//
// Grammar: <number> [spaces] <unit>, surrounding spaces allowed. <number> is a decimal
// (optional sign, digits, optional fraction, optional exponent: "1.5", "2e3"). A plain
// number without a unit is rejected: units are never implicit.
//
// Prefixes (source: SI brochure 9th ed. Table 7 for k, M, G, T, P, E; IEC 80000-13 for
// Ki, Mi, Gi, Ti, Pi):
//   decimal  k (also K) = 1e3, M = 1e6, G = 1e9, T = 1e12, P = 1e15, E = 1e18 (FLOP/s only)
//   binary   Ki = 2^10, Mi = 2^20, Gi = 2^30, Ti = 2^40, Pi = 2^50 (bytes and bandwidth)
// Units:
//   bandwidth  <prefix>B/s (bytes) or <prefix>b/s, <prefix>bit/s (bits; 1 B = 8 b)
//   time       ns, us (also µs), ms, s
//   bytes      <prefix>B
//   FLOP rate  <prefix>FLOP/s or <prefix>FLOPS
//
// Errors: every parser throws dtsim::InputError with exactly one problem of the form
//   "<text>" is not a bandwidth (expected e.g. "450 GB/s")
// or, for a well-formed value whose SI value overflows a double ("1e300 GiB"),
//   "<text>" is beyond the range of a size in bytes (...)
// Callers prefix it with the file and key, e.g. parse_quantity_at(...) produces
//   exp.yaml: cluster.nvlink.bandwidth="450 GB" is not a bandwidth (expected e.g. "450 GB/s")
#include <string>
#include <string_view>

namespace dtsim {

enum class Quantity { bandwidth, time, bytes, flop_rate };

/// "a bandwidth", "a time", "a size in bytes", "a FLOP rate" (used in messages).
const char* describe(Quantity q);
/// An example of a well-formed value, e.g. "450 GB/s".
const char* example(Quantity q);

/// Parses `text` as quantity `q`, returns SI base units (B/s, s, bytes, FLOP/s).
/// Throws InputError(`"<text>" is not <describe(q)> (expected e.g. "<example(q)>")`).
double parse_quantity(std::string_view text, Quantity q);

/// Same, but the problem is prefixed with `where` followed by '=': with
/// where = "exp.yaml: cluster.nvlink.bandwidth" the message reads
/// `exp.yaml: cluster.nvlink.bandwidth="450 GB" is not a bandwidth (expected e.g. "450 GB/s")`.
double parse_quantity_at(std::string_view text, Quantity q, const std::string& where);

/// Bandwidth in B/s ("450 GB/s", "200 Gb/s", "25 GiB/s", "1.5 TB/s").
double parse_bandwidth(std::string_view text);
/// Time in seconds ("1.5 us", "3 ms", "2 s", "500 ns").
double parse_time(std::string_view text);
/// Size in bytes ("80 GiB", "141 GB", "512 MiB").
double parse_bytes(std::string_view text);
/// FLOP rate in FLOP/s ("312 TFLOP/s", "989.4 TFLOP/s", "2.25 PFLOP/s").
double parse_flop_rate(std::string_view text);

}  // namespace dtsim
