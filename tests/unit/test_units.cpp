// Quantities with units (models/units.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "models/errors.hpp"
#include "models/units.hpp"

namespace dtsim {
namespace {

constexpr double KiB = 1024.0;
constexpr double MiB = 1024.0 * KiB;
constexpr double GiB = 1024.0 * MiB;

// The single problem of the InputError thrown by `f`, or "" when nothing is thrown.
template <class F>
std::string problem_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    EXPECT_EQ(e.problems().size(), 1u);
    return e.problems().empty() ? std::string() : e.problems().front();
  }
  return "";
}

TEST(Units, BandwidthDecimalBytes) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("450 GB/s"), 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1.5 TB/s"), 1.5e12);
  EXPECT_DOUBLE_EQ(parse_bandwidth("2039 GB/s"), 2039e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("12 MB/s"), 12e6);
  EXPECT_DOUBLE_EQ(parse_bandwidth("3 kB/s"), 3e3);
  EXPECT_DOUBLE_EQ(parse_bandwidth("3 KB/s"), 3e3);
  EXPECT_DOUBLE_EQ(parse_bandwidth("7 B/s"), 7.0);
}

TEST(Units, BandwidthBitsAreEighthOfBytes) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("200 Gb/s"), 25e9);   // one HDR NIC
  EXPECT_DOUBLE_EQ(parse_bandwidth("400 Gb/s"), 50e9);   // one NDR NIC
  EXPECT_DOUBLE_EQ(parse_bandwidth("400 Gbit/s"), 50e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("8 b/s"), 1.0);
  EXPECT_DOUBLE_EQ(parse_bandwidth("100 Mb/s"), 12.5e6);
}

TEST(Units, BandwidthBinaryPrefixes) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("25 GiB/s"), 25 * GiB);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1 KiB/s"), 1024.0);
  EXPECT_DOUBLE_EQ(parse_bandwidth("2 TiB/s"), 2 * 1024.0 * GiB);
  EXPECT_DOUBLE_EQ(parse_bandwidth("8 Gib/s"), GiB);  // binary bits
  EXPECT_NE(parse_bandwidth("25 GiB/s"), parse_bandwidth("25 GB/s"));
}

TEST(Units, BandwidthSpacingAndNumberForms) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("450GB/s"), 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("  450   GB/s  "), 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("4.5e2 GB/s"), 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth(".5 GB/s"), 0.5e9);
}

TEST(Units, Time) {
  EXPECT_DOUBLE_EQ(parse_time("1.5 us"), 1.5e-6);
  EXPECT_DOUBLE_EQ(parse_time("3 ms"), 3e-3);
  EXPECT_DOUBLE_EQ(parse_time("2 s"), 2.0);
  EXPECT_DOUBLE_EQ(parse_time("500 ns"), 500e-9);
  EXPECT_DOUBLE_EQ(parse_time("2 \xC2\xB5s"), 2e-6);  // micro sign
  EXPECT_DOUBLE_EQ(parse_time("2 \xCE\xBCs"), 2e-6);  // greek mu
}

TEST(Units, Bytes) {
  EXPECT_DOUBLE_EQ(parse_bytes("80 GiB"), 80 * GiB);
  EXPECT_DOUBLE_EQ(parse_bytes("141 GB"), 141e9);
  EXPECT_DOUBLE_EQ(parse_bytes("512 MiB"), 512 * MiB);
  EXPECT_DOUBLE_EQ(parse_bytes("81920 MiB"), 80 * GiB);
  EXPECT_DOUBLE_EQ(parse_bytes("3 B"), 3.0);
}

TEST(Units, FlopRate) {
  EXPECT_DOUBLE_EQ(parse_flop_rate("312 TFLOP/s"), 312e12);
  EXPECT_DOUBLE_EQ(parse_flop_rate("989.4 TFLOP/s"), 989.4e12);
  EXPECT_DOUBLE_EQ(parse_flop_rate("2.25 PFLOP/s"), 2.25e15);
  EXPECT_DOUBLE_EQ(parse_flop_rate("1979 TFLOPS"), 1979e12);
  EXPECT_DOUBLE_EQ(parse_flop_rate("19.5 GFLOP/s"), 19.5e9);
}

TEST(Units, PlainNumberIsRejectedNamingTheExpectedUnit) {
  EXPECT_EQ(problem_of([] { parse_bandwidth("450"); }), "\"450\" is not a bandwidth (expected e.g. \"450 GB/s\")");
  EXPECT_EQ(problem_of([] { parse_time("1.5"); }), "\"1.5\" is not a time (expected e.g. \"1.5 us\")");
  EXPECT_EQ(problem_of([] { parse_bytes("80"); }), "\"80\" is not a size in bytes (expected e.g. \"80 GiB\")");
  EXPECT_EQ(problem_of([] { parse_flop_rate("312"); }), "\"312\" is not a FLOP rate (expected e.g. \"312 TFLOP/s\")");
}

TEST(Units, WrongQuantityIsRejected) {
  EXPECT_EQ(problem_of([] { parse_bandwidth("450 GB"); }), "\"450 GB\" is not a bandwidth (expected e.g. \"450 GB/s\")");
  EXPECT_EQ(problem_of([] { parse_bytes("80 GB/s"); }), "\"80 GB/s\" is not a size in bytes (expected e.g. \"80 GiB\")");
  EXPECT_EQ(problem_of([] { parse_bytes("80 Gb"); }), "\"80 Gb\" is not a size in bytes (expected e.g. \"80 GiB\")");
  EXPECT_EQ(problem_of([] { parse_time("3 GB"); }), "\"3 GB\" is not a time (expected e.g. \"1.5 us\")");
  EXPECT_EQ(problem_of([] { parse_flop_rate("312 TFLOP"); }),
            "\"312 TFLOP\" is not a FLOP rate (expected e.g. \"312 TFLOP/s\")");
}

TEST(Units, MalformedTextIsRejected) {
  for (const char* bad : {"", "   ", "GB/s", "abc", "inf GB/s", "nan GB/s", "1.5.2 GB/s", "450 gb/s", "450 mB/s",
                          "450 GB/s extra", "0x10 GB/s", "1e GB/s", "450 XB/s", "450 Ki B/s"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_bandwidth(bad), InputError);
  }
  for (const char* bad : {"1.5 uss", "3 msec", "2 S", "2 sec", "1 h"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_time(bad), InputError);
  }
}

TEST(Units, ParseQuantityAtPrefixesFileAndKey) {
  EXPECT_EQ(problem_of([] {
              parse_quantity_at("450 GB", Quantity::bandwidth, "exp.yaml: cluster.nvlink.bandwidth");
            }),
            "exp.yaml: cluster.nvlink.bandwidth=\"450 GB\" is not a bandwidth (expected e.g. \"450 GB/s\")");
  EXPECT_DOUBLE_EQ(parse_quantity_at("4 us", Quantity::time, "x"), 4e-6);
}

TEST(Units, NegativeNumbersParseSoValidationCanNameTheKey) {
  // Sign checks belong to validation (which knows the key); the parser keeps the value.
  EXPECT_DOUBLE_EQ(parse_bandwidth("-1 GB/s"), -1e9);
}

}  // namespace
}  // namespace dtsim
