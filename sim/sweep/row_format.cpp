#include "sim/sweep/row_format.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include <nlohmann/json.hpp>

#include "models/schedules/schedule.hpp"
#include "reports/csv.hpp"

namespace dtsim::sweep {

// The fields of a row, in the order of to_json(SweepRow) (sim/sweep/journal.cpp): the
// journal record's column order. X(name, kind, expression of `r`).
#define DTSIM_SWEEP_ROW_FIELDS(X)                  \
  X(id, i64, r.id)                                 \
  X(engine, str, r.engine)                         \
  X(cluster, i64, r.cluster)                       \
  X(cluster_label, str, r.cluster_label)           \
  X(gpu, str, r.gpu)                               \
  X(nodes, i64, r.nodes)                           \
  X(gpus, i64, r.gpus)                             \
  X(dp, i64, r.layout.dp)                          \
  X(tp, i64, r.layout.tp)                          \
  X(cp, i64, r.layout.cp)                          \
  X(pp, i64, r.layout.pp)                          \
  X(vp, i64, r.layout.vp)                          \
  X(ep, i64, r.layout.ep)                          \
  X(etp, i64, r.layout.etp)                        \
  X(schedule, sched, r.layout.schedule)            \
  X(zero_stage, i32, r.layout.zero_stage)          \
  X(micro_batch, i64, r.micro_batch)               \
  X(micro_batches, i64, r.micro_batches)           \
  X(recompute, recomp, r.layout.recompute)         \
  X(sequence_parallel, boolean, r.layout.sequence_parallel) \
  X(status, str, r.status)                         \
  X(reason, str, r.reason)                         \
  X(step_time_s, f64, r.step_time_s)               \
  X(tokens_per_s, f64, r.tokens_per_s)             \
  X(tokens_per_s_per_gpu, f64, r.tokens_per_s_per_gpu) \
  X(mfu, f64, r.mfu)                               \
  X(tflops_per_gpu, f64, r.tflops_per_gpu)         \
  X(compute_s, f64, r.compute_s)                   \
  X(bubble_s, f64, r.bubble_s)                     \
  X(host_bound_s, f64, r.host_bound_s)             \
  X(optimizer_s, f64, r.optimizer_s)               \
  X(exposed_tp_s, f64, r.exposed_tp_s)             \
  X(exposed_cp_s, f64, r.exposed_cp_s)             \
  X(exposed_pp_s, f64, r.exposed_pp_s)             \
  X(exposed_dp_s, f64, r.exposed_dp_s)             \
  X(exposed_ep_s, f64, r.exposed_ep_s)             \
  X(peak_memory_bytes, f64, r.peak_memory_bytes)   \
  X(capacity_bytes, f64, r.capacity_bytes)         \
  X(usd_per_step, f64, r.usd_per_step)             \
  X(usd_per_mtoken, f64, r.usd_per_mtoken)

namespace {

// ---------------------------------------------------------------- shared writers --

/// An append-only buffer in front of a std::string: a row's many small pieces go to a fixed
/// array, moved to the string when it is full and at the end (no std::string call and
/// capacity check per character or number).
class Buf {
 public:
  explicit Buf(std::string& out) : out_(out) {}
  ~Buf() { flush(); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf& operator+=(char c) {
    room(1);
    buf_[n_++] = c;
    return *this;
  }
  Buf& operator+=(std::string_view v) {
    append(v.data(), v.size());
    return *this;
  }
  void append(const char* p, size_t k) {
    if (k > kSize / 4) {  // long text: straight to the string
      flush();
      out_.append(p, k);
      return;
    }
    room(k);
    std::memcpy(buf_ + n_, p, k);
    n_ += k;
  }
  void append(size_t k, char c) {
    for (size_t i = 0; i < k; ++i) *this += c;
  }
  /// `k` writable characters at the end; commit(end) keeps those up to `end`.
  char* room_for(size_t k) {
    room(k);
    return buf_ + n_;
  }
  void commit(const char* end) { n_ = static_cast<size_t>(end - buf_); }
  /// Replaces the last character written.
  void set_last(char c) {
    if (n_ > 0) buf_[n_ - 1] = c;
    else out_.back() = c;
  }
  void flush() {
    out_.append(buf_, n_);
    n_ = 0;
  }

 private:
  static constexpr size_t kSize = 2048;
  void room(size_t k) {
    if (n_ + k > kSize) flush();
  }
  std::string& out_;
  size_t n_ = 0;
  char buf_[kSize];
};

void put_int(Buf& out, int64_t v) {
  char* p = out.room_for(24);
  out.commit(std::to_chars(p, p + 24, v).ptr);
}

/// Text that JSON and nlohmann write as it is: printable ASCII but '"' and '\'.
bool json_plain(std::string_view s) {
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7F || c == '"' || c == '\\') return false;
  }
  return true;
}

/// append_json_string into a Buf.
void json_string(Buf& out, std::string_view s) {
  if (json_plain(s)) {
    out += '"';
    out += s;
    out += '"';
    return;
  }
  out += nlohmann::json(std::string(s)).dump();  // escapes and UTF-8 checks as nlohmann does
}

/// append_json_double into a Buf.
void json_double(Buf& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char* p = out.room_for(64);
  out.commit(nlohmann::detail::to_chars(p, p + 64, v));
}

/// append_csv_number into a Buf.
void csv_number_to(Buf& out, double v) {
  if (!std::isfinite(v)) return;
  if (v == 0) {
    out += '0';
    return;
  }
  // csv_number's fmt::format("{:.9g}", v): printf's %.9g, which std::to_chars in general
  // format with precision 9 writes too, correctly rounded (the same characters; faster).
  char* p = out.room_for(40);
  out.commit(std::to_chars(p, p + 40, v, std::chars_format::general, 9).ptr);
}

// ------------------------------------------------------------- journal (format 2) --

void rec_i64(Buf& out, int64_t v) { put_int(out, v); }
void rec_i32(Buf& out, int v) { put_int(out, v); }
void rec_boolean(Buf& out, bool v) { out += v ? "true" : "false"; }
void rec_str(Buf& out, const std::string& s) { json_string(out, s); }
void rec_sched(Buf& out, Schedule s) { json_string(out, to_string(s)); }
void rec_recomp(Buf& out, Recompute v) { json_string(out, to_string(v)); }
void rec_f64(Buf& out, double v) {
  if (std::isnan(v)) {
    out += "\"nan\"";
  } else if (std::isinf(v)) {
    out += v > 0 ? "\"inf\"" : "\"-inf\"";
  } else {
    char* p = out.room_for(40);
    out.commit(std::to_chars(p, p + 40, v).ptr);  // shortest round-trip
  }
}

/// A cursor over one record line.
struct Reader {
  std::string_view s;
  size_t i = 0;
  std::string error;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
  }
  bool expect(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  /// The end of a number token.
  size_t number_end() const {
    size_t j = i;
    while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '-' || s[j] == '+' ||
                            s[j] == '.' || s[j] == 'e' || s[j] == 'E'))
      ++j;
    return j;
  }
  /// A JSON number at the cursor, parsed whole by std::from_chars.
  template <class T>
  bool number(T& v) {
    const size_t e = number_end();
    if (e == i) return false;
    const auto res = std::from_chars(s.data() + i, s.data() + e, v);
    if (res.ec != std::errc() || res.ptr != s.data() + e) return false;
    i = e;
    return true;
  }
  bool i64(int64_t& v) {
    ws();
    return number(v);
  }
  bool i32(int& v) {
    int64_t x = 0;
    if (!i64(x) || x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) return false;
    v = static_cast<int>(x);
    return true;
  }
  bool boolean(bool& v) {
    ws();
    if (s.substr(i, 4) == "true") {
      v = true;
      i += 4;
      return true;
    }
    if (s.substr(i, 5) == "false") {
      v = false;
      i += 5;
      return true;
    }
    return false;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool hex4(uint32_t& v) {
    if (i + 4 > s.size()) return false;
    v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else return false;
    }
    return true;
  }
  bool str(std::string& out) {
    ws();
    if (i >= s.size() || s[i] != '"') return false;
    ++i;
    out.clear();
    while (i < s.size()) {
      const size_t run = i;
      while (i < s.size() && s[i] != '"' && s[i] != '\\') ++i;
      out.append(s.data() + run, i - run);
      if (i >= s.size()) return false;
      if (s[i] == '"') {
        ++i;
        return true;
      }
      ++i;  // backslash
      if (i >= s.size()) return false;
      const char c = s[i++];
      switch (c) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
            uint32_t lo = 0;
            if (i + 2 > s.size() || s[i] != '\\' || s[i + 1] != 'u') return false;
            i += 2;
            if (!hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return false;
          }
          put_utf8(out, cp);
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  bool f64(double& v) {
    ws();
    if (i < s.size() && s[i] == '"') {
      std::string t;
      if (!str(t)) return false;
      if (t == "nan") v = std::numeric_limits<double>::quiet_NaN();
      else if (t == "inf") v = std::numeric_limits<double>::infinity();
      else if (t == "-inf") v = -std::numeric_limits<double>::infinity();
      else return false;
      return true;
    }
    return number(v);
  }
  bool sched(Schedule& v) {
    std::string t;
    if (!str(t)) return false;
    const sched::PipelineSchedule* p = sched::find_schedule(t);
    if (!p) {
      error = "unknown schedule \"" + t + "\"";
      return false;
    }
    v = p->id();
    return true;
  }
  bool recomp(Recompute& v) {
    std::string t;
    if (!str(t)) return false;
    if (t == "selective") v = Recompute::selective;
    else if (t == "full") v = Recompute::full;
    else if (t == "none") v = Recompute::none;
    else {
      error = "unknown recompute \"" + t + "\"";
      return false;
    }
    return true;
  }
};

const char* expected(std::string_view kind) {
  if (kind == "i64" || kind == "i32") return "an integer";
  if (kind == "boolean") return "true or false";
  if (kind == "str") return "a string";
  if (kind == "f64") return "a number";
  if (kind == "sched") return "a schedule name";
  return "a recompute mode";
}

// ---------------------------------------------------------------- sweep.json rows --

void js_i64(Buf& out, int64_t v) { put_int(out, v); }
void js_i32(Buf& out, int v) { put_int(out, v); }
void js_boolean(Buf& out, bool v) { out += v ? "true" : "false"; }
void js_str(Buf& out, const std::string& s) { json_string(out, s); }
void js_sched(Buf& out, Schedule s) { json_string(out, to_string(s)); }
void js_recomp(Buf& out, Recompute v) { json_string(out, to_string(v)); }
void js_f64(Buf& out, double v) { json_double(out, v); }

using FieldWriter = void (*)(Buf&, const SweepRow&);

struct JsonField {
  std::string_view name;
  FieldWriter write;
};

/// The fields as nlohmann orders an object's keys (std::map: byte order).
const std::vector<JsonField>& json_fields_sorted() {
  static const std::vector<JsonField> fields = [] {
    std::vector<JsonField> f = {
#define DTSIM_JSON_FIELD(name, kind, expr) \
  {#name, [](Buf& out, const SweepRow& r) { js_##kind(out, expr); }},
        DTSIM_SWEEP_ROW_FIELDS(DTSIM_JSON_FIELD)
#undef DTSIM_JSON_FIELD
    };
    std::sort(f.begin(), f.end(), [](const JsonField& a, const JsonField& b) { return a.name < b.name; });
    return f;
  }();
  return fields;
}

/// Per field of json_fields_sorted, what precedes its value at nesting depth `depth`: the
/// indent of depth + 1 spaces, the quoted key and ": " (made once for the usual depths).
constexpr int kCachedDepths = 8;
std::vector<std::string> json_key_prefixes(int depth) {
  std::vector<std::string> out;
  for (const JsonField& f : json_fields_sorted())
    out.push_back(std::string(static_cast<size_t>(depth) + 1, ' ') + '"' + std::string(f.name) + "\": ");
  return out;
}
const std::vector<std::string>& json_key_prefixes_cached(int depth) {
  static const std::array<std::vector<std::string>, kCachedDepths> cache = [] {
    std::array<std::vector<std::string>, kCachedDepths> c;
    for (int d = 0; d < kCachedDepths; ++d) c[static_cast<size_t>(d)] = json_key_prefixes(d);
    return c;
  }();
  return cache[static_cast<size_t>(depth)];
}

// ----------------------------------------------------------------------- CSV --

/// csv_field(s), without a copy unless it is to be prefixed (a formula-like cell, rare).
void put_csv_text(Buf& out, std::string_view s) {
  if (!s.empty() && std::string_view("=+-@\t\r").find(s.front()) != std::string_view::npos) {
    out += csv_field(std::string(s));
    return;
  }
  size_t i = 0;
  while (i < s.size() && s[i] != ',' && s[i] != '"' && s[i] != '\r' && s[i] != '\n') ++i;
  if (i == s.size()) {
    out += s;
    return;
  }
  // Quoted, each '"' doubled (csv_field).
  out += '"';
  size_t run = 0;
  for (i = 0; i < s.size(); ++i)
    if (s[i] == '"') {
      out.append(s.data() + run, i + 1 - run);
      out += '"';
      run = i + 1;
    }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

}  // namespace

const std::vector<std::string>& journal_columns() {
  static const std::vector<std::string> cols = {
#define DTSIM_COLUMN_NAME(name, kind, expr) #name,
      DTSIM_SWEEP_ROW_FIELDS(DTSIM_COLUMN_NAME)
#undef DTSIM_COLUMN_NAME
  };
  return cols;
}

void append_journal_record(std::string& s, const SweepRow& r) {
  Buf out(s);
  out += '[';
#define DTSIM_RECORD_FIELD(name, kind, expr) \
  rec_##kind(out, expr);                     \
  out += ',';
  DTSIM_SWEEP_ROW_FIELDS(DTSIM_RECORD_FIELD)
#undef DTSIM_RECORD_FIELD
  out.set_last(']');
  out += '\n';
}

bool parse_journal_record(std::string_view line, SweepRow& r, std::string& error) {
  Reader rd;
  rd.s = line;
  if (!rd.expect('[')) {
    error = "not a journal record (expected '[')";
    return false;
  }
  bool first = true;
#define DTSIM_PARSE_FIELD(name, kind, expr)                                                              \
  if (!first && !rd.expect(',')) {                                                                       \
    error = "record ends before field \"" #name "\" (expected " + std::to_string(journal_columns().size()) + \
            " fields)";                                                                                  \
    return false;                                                                                        \
  }                                                                                                      \
  first = false;                                                                                         \
  if (!rd.kind(expr)) {                                                                                  \
    error = "field \"" #name "\": " + (rd.error.empty() ? std::string("expected ") + expected(#kind) : rd.error); \
    return false;                                                                                        \
  }
  DTSIM_SWEEP_ROW_FIELDS(DTSIM_PARSE_FIELD)
#undef DTSIM_PARSE_FIELD
  (void)first;
  if (!rd.expect(']')) {
    error = "record has more than " + std::to_string(journal_columns().size()) + " fields";
    return false;
  }
  rd.ws();
  if (rd.i != line.size()) {
    error = "text after the record";
    return false;
  }
  return true;
}

void append_json_string(std::string& s, std::string_view v) {
  Buf out(s);
  json_string(out, v);
}

void append_json_double(std::string& s, double v) {
  Buf out(s);
  json_double(out, v);
}

void append_row_json(std::string& s, const SweepRow& r, int depth) {
  const auto& fields = json_fields_sorted();
  const bool cached = depth >= 0 && depth < kCachedDepths;
  const std::vector<std::string> made = cached ? std::vector<std::string>{} : json_key_prefixes(depth);
  const std::vector<std::string>& prefix = cached ? json_key_prefixes_cached(depth) : made;
  Buf out(s);
  out += "{\n";
  for (size_t k = 0; k < fields.size(); ++k) {
    out += prefix[k];
    fields[k].write(out, r);
    out += k + 1 < fields.size() ? ",\n" : "\n";
  }
  out.append(static_cast<size_t>(depth), ' ');
  out += '}';
}

void append_csv_number(std::string& s, double v) {
  Buf out(s);
  csv_number_to(out, v);
}

void append_csv_line(std::string& s, const SweepRow& r) {
  Buf out(s);
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  const Layout& l = r.layout;
  auto i = [&](int64_t v) {
    put_int(out, v);
    out += ',';
  };
  auto t = [&](std::string_view s) {
    put_csv_text(out, s);
    out += ',';
  };
  auto d = [&](double v) {
    csv_number_to(out, v);
    out += ',';
  };
  i(r.id);
  t(r.engine);
  i(r.cluster);
  t(r.cluster_label);
  t(r.gpu);
  i(r.nodes);
  i(r.gpus);
  i(l.dp);
  i(l.tp);
  i(l.cp);
  i(l.pp);
  i(l.vp);
  i(l.ep);
  i(l.expert_tp());
  t(to_string(l.schedule));
  i(l.zero_stage);
  i(r.micro_batch);
  i(r.micro_batches);
  t(to_string(l.recompute));
  t(l.sequence_parallel ? "true" : "false");
  t(r.status);
  t(r.reason);
  d(r.step_time_s);
  d(r.tokens_per_s);
  d(r.tokens_per_s_per_gpu);
  d(r.mfu);
  d(r.tflops_per_gpu);
  d(r.compute_s);
  d(r.bubble_s);
  d(r.host_bound_s);
  d(r.optimizer_s);
  d(r.exposed_tp_s);
  d(r.exposed_cp_s);
  d(r.exposed_pp_s);
  d(r.exposed_dp_s);
  d(r.exposed_ep_s);
  d(r.peak_memory_bytes / gib);
  d(r.capacity_bytes / gib);
  d(r.usd_per_step);
  d(r.usd_per_mtoken);
  out.set_last('\n');
}

}  // namespace dtsim::sweep
