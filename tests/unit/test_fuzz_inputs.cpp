// Fuzz-style test of the input readers: deterministic, seeded mutations of every shipped
// experiment YAML (and sweep / compare file), of the shipped Hugging Face config.json and of
// --set strings. Each mutated input must either load or be refused with InputError: never
// another exception type, never a crash (the sanitizer build, scripts/test.sh, runs this
// test too: out-of-bounds reads and signed overflow abort it). What loads is also planned
// (build_step_plan) when its plan is small, so the cost models see the mutated numbers.
// The number of inputs is fixed (kMutationsPerFile per file), so the run is bounded; the
// stated limits (models/checked.hpp) bound the work each input can ask for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/sweep_spec.hpp"
#include "tests/unit/shipped_files.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

using test_files::kExperiments;
constexpr int kMutationsPerFile = 60;
// Plans up to this many ops are built for the inputs that load (the shipped ones need up
// to about 200,000; the sanitizer build is several times slower).
constexpr int64_t kPlanOpsToBuild = 60'000;

/// splitmix64 (Steele, Lea, Flood 2014): a small fixed-seed generator, the same sequence
/// on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

 private:
  uint64_t s_;
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

/// Values that stress the readers: huge, negative, zero, not numbers, wrong types, deep or
/// unterminated structures.
const std::vector<std::string>& nasty_values() {
  static const std::vector<std::string> v = {
      "9223372036854775807", "-9223372036854775808", "99999999999999999999999", "2305843009213693954",
      "4294967296", "1048577", "16777217", "0", "-1", "-0", "1e308", "-1e308", "1e-320", ".nan", "nan", ".inf",
      "-.inf", "inf", "0x10", "1_000", "4.5", "1e3", "+7", "\"\"", "''", "~", "null", "[]", "{}", "[1, 2]",
      "{a: 1}", "true", "yes", "auto", "\"unterminated", "'unterminated", "[1, 2", "{a: 1", "&a 1", "*a", "!!binary 1",
      "8 GB", "900 GB/s", "-5 us", "1e400 B", "\xff\xfe", "\t", std::string(5000, '9'), std::string(300, '[') + "1" +
      std::string(300, ']'), std::string(2000, '['), "a: b: c"};
  return v;
}

/// One mutation of YAML text; `what` says which (for the failure message).
std::string mutate_yaml(const std::string& text, Rng& rng, std::string& what) {
  std::vector<std::string> lines = lines_of(text);
  if (lines.empty()) lines.push_back("");
  const size_t i = rng.below(lines.size()), j = rng.below(lines.size());
  auto colon_value = [&](size_t k, const std::string& value) {
    const auto c = lines[k].find(':');
    if (c == std::string::npos) lines[k] += " " + value;
    else lines[k] = lines[k].substr(0, c + 1) + " " + value;
  };
  switch (rng.below(12)) {
    case 0:
      what = "delete line " + std::to_string(i + 1);
      lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    case 1:
      what = "duplicate line " + std::to_string(i + 1);
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), lines[i]);
      break;
    case 2: {
      what = "swap the values of lines " + std::to_string(i + 1) + " and " + std::to_string(j + 1);
      const auto ci = lines[i].find(':'), cj = lines[j].find(':');
      if (ci != std::string::npos && cj != std::string::npos) {
        const std::string vi = lines[i].substr(ci), vj = lines[j].substr(cj);
        lines[i] = lines[i].substr(0, ci) + vj;
        lines[j] = lines[j].substr(0, cj) + vi;
      }
      break;
    }
    case 3:
    case 4:
    case 5: {
      const std::string& v = rng.pick(nasty_values());
      what = "line " + std::to_string(i + 1) + " value -> " + v.substr(0, 40);
      colon_value(i, v);
      break;
    }
    case 6: {
      const std::string t = join_lines(lines);
      const size_t cut = rng.below(t.size() + 1);
      what = "truncate at byte " + std::to_string(cut);
      return t.substr(0, cut);
    }
    case 7: {
      const size_t depth = 50 + rng.below(5000);
      what = "nest " + std::to_string(depth) + " maps at line " + std::to_string(i + 1);
      std::string nest;
      for (size_t d = 0; d < depth; ++d) nest += "{a: ";
      nest += "1";
      for (size_t d = 0; d < depth; ++d) nest += "}";
      colon_value(i, nest);
      break;
    }
    case 8: {
      std::string t = join_lines(lines);
      if (!t.empty()) {
        const size_t at = rng.below(t.size());
        t[at] = static_cast<char>(rng.next() & 0xff);
        what = "byte " + std::to_string(at) + " replaced";
      }
      return t;
    }
    case 9:
      what = "indent line " + std::to_string(i + 1);
      lines[i] = (rng.below(2) ? "\t" : "   ") + lines[i];
      break;
    case 10:
      what = "unterminated string at line " + std::to_string(i + 1);
      colon_value(i, "\"abc\n  def: 1");
      break;
    case 11:
      what = "a second document";
      lines.push_back("---");
      lines.push_back("title: again");
      break;
  }
  return join_lines(lines);
}

/// Runs `f`; fails the test when it throws anything but InputError.
template <class F>
void expect_loads_or_input_error(const std::string& where, F&& f) {
  try {
    f();
  } catch (const InputError&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << ": threw " << typeid(e).name() << ": " << e.what();
  } catch (...) {
    ADD_FAILURE() << where << ": threw a non-std exception";
  }
}

void load_and_plan(const std::string& text, const std::string& base_dir, const std::vector<std::string>& sets = {}) {
  const Experiment e = parse_experiment(text, "fuzz.yaml", sets, base_dir);
  if (plan_op_bound(e) <= kPlanOpsToBuild) build_step_plan(e);
}

std::vector<fs::path> shipped(bool sweeps) { return test_files::shipped_yaml(sweeps); }

TEST(FuzzInputs, MutatedExperimentFilesLoadOrRaiseInputError) {
  const auto files = shipped(false);
  ASSERT_GE(files.size(), 20u);
  uint64_t seed = 1;
  int loaded = 0, refused = 0;
  for (const auto& f : files) {
    const std::string text = read_text(f);
    const std::string dir = f.parent_path().string();
    Rng rng(seed++);
    for (int k = 0; k < kMutationsPerFile; ++k) {
      std::string what;
      const std::string mutated = mutate_yaml(text, rng, what);
      bool ok = true;
      expect_loads_or_input_error(f.filename().string() + " [" + what + "]", [&] {
        try {
          load_and_plan(mutated, dir);
        } catch (const InputError&) {
          ok = false;
          throw;
        }
      });
      (ok ? loaded : refused)++;
    }
  }
  // The mutations reach both outcomes (a mutation that never loads tests little).
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
}

TEST(FuzzInputs, MutatedSweepAndCompareFilesLoadOrRaiseInputError) {
  uint64_t seed = 1000;
  int files = 0;
  for (const auto& f : shipped(true)) {
    const std::string name = f.filename().string();
    if (name.rfind("plan-", 0) == 0) continue;  // plan files have their own reader (models/plan_spec.hpp)
    const SpecKind kind = name.rfind("compare-", 0) == 0 ? SpecKind::compare : SpecKind::sweep;
    const std::string text = read_text(f);
    Rng rng(seed++);
    ++files;
    for (int k = 0; k < kMutationsPerFile / 2; ++k) {
      std::string what;
      const std::string mutated = mutate_yaml(text, rng, what);
      expect_loads_or_input_error(name + " [" + what + "]",
                                  [&] { parse_sweep_spec(mutated, name, kind, f.parent_path().string()); });
    }
  }
  EXPECT_GE(files, 3);
}

TEST(FuzzInputs, MutatedHfConfigLoadsOrRaisesInputError) {
  const fs::path src = kExperiments / "examples";
  const std::string yaml = read_text(src / "llama3-8b-h100.yaml");
  const std::string json = read_text(src / "llama3-8b.config.json");
  ASSERT_NE(yaml.find("hf_config: llama3-8b.config.json"), std::string::npos);
  const fs::path dir = fs::temp_directory_path() / ("dtsim-fuzz-hf-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<std::string> json_values = {
      "0", "-1", "9223372036854775807", "-9223372036854775808", "18446744073709551615", "1e400", "4096.5", "null",
      "true", "\"4096\"", "[]", "{}", "[[[[[[[[[[1]]]]]]]]]]", std::string(3000, '[') + std::string(3000, ']'),
      "\"gelu_new\"", "\"relu\"", "\"gpt2\"", "\"unknown\""};
  Rng rng(77);
  std::vector<std::string> lines = lines_of(json);
  for (int k = 0; k < 2 * kMutationsPerFile; ++k) {
    std::vector<std::string> l = lines;
    std::string what;
    const size_t i = rng.below(l.size());
    switch (rng.below(4)) {
      case 0: {
        const auto c = l[i].find("\": ");
        const std::string& v = rng.pick(json_values);
        what = "line " + std::to_string(i + 1) + " value -> " + v.substr(0, 40);
        if (c != std::string::npos) l[i] = l[i].substr(0, c + 3) + v + (l[i].back() == ',' ? "," : "");
        break;
      }
      case 1:
        what = "delete line " + std::to_string(i + 1);
        l.erase(l.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      case 2:
        what = "duplicate line " + std::to_string(i + 1);
        l.insert(l.begin() + static_cast<std::ptrdiff_t>(i), l[i]);
        break;
      case 3: {
        const std::string t = join_lines(l);
        const size_t cut = rng.below(t.size());
        what = "truncate at byte " + std::to_string(cut);
        l = {t.substr(0, cut)};
        break;
      }
    }
    {
      std::ofstream out(dir / "llama3-8b.config.json", std::ios::binary | std::ios::trunc);
      out << join_lines(l);
    }
    expect_loads_or_input_error("config.json [" + what + "]", [&] { load_and_plan(yaml, dir.string()); });
  }
  fs::remove_all(dir);
}

TEST(FuzzInputs, GeneratedSetStringsLoadOrRaiseInputError) {
  const fs::path src = kExperiments / "examples";
  const std::string yaml = read_text(src / "llama3-8b-h100.yaml");
  const std::vector<std::string> keys = {
      "title", "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn_hidden", "model.vocab",
      "model.max_position_embeddings", "model.activation", "model.hf_config", "cluster.nodes",
      "cluster.gpus_per_node", "cluster.gpu", "cluster.gpu.hbm", "cluster.gpu.peak_bf16", "cluster.gpu.sm_count",
      "cluster.nvlink.bandwidth", "cluster.nic.latency", "cluster.fabric", "cluster.fabric.nodes_per_leaf",
      "cluster.hbm_reserve", "layout.dp", "layout.tp", "layout.cp", "layout.pp", "layout.vp", "layout.schedule",
      "layout.zero_stage", "layout.recompute", "training.seq_len", "training.global_batch", "training.micro_batch",
      "training.grad_bucket", "training.dtype", "published.mfu", "", ".", "model.", ".layers", "model..layers",
      "model.layers.x", "nosuch", "cluster.gpu.preset.x", std::string(2000, 'a'), "layout.tp\n"};
  std::vector<std::string> values = nasty_values();
  for (const char* v : {"1", "2", "4", "8", "3", "a100", "h100-sxm", "leaf-spine", "interleaved", "full", "fp8"})
    values.push_back(v);
  Rng rng(4242);
  for (int k = 0; k < 4 * kMutationsPerFile; ++k) {
    std::vector<std::string> sets;
    const size_t n = 1 + rng.below(3);
    for (size_t i = 0; i < n; ++i) {
      const std::string& key = rng.pick(keys);
      switch (rng.below(8)) {
        case 0: sets.push_back(key); break;            // no '='
        case 1: sets.push_back(key + "=="); break;
        case 2: sets.push_back(std::string(1, '=').append(rng.pick(values))); break;
        default: sets.push_back(key + "=" + rng.pick(values)); break;
      }
    }
    std::string where = "--set";
    for (const auto& s : sets) where.append(" ").append(s.substr(0, 60));
    expect_loads_or_input_error(where, [&] { load_and_plan(yaml, src.string(), sets); });
  }
}

}  // namespace
}  // namespace dtsim
