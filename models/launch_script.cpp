// Reading a launch command out of a shell script: see models/launch_script.hpp.
#include "models/launch_script.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <functional>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "models/errors.hpp"

namespace dtsim {

namespace {

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// ---------------------------------------------------------------------------------------
// Stage 1: statements. Backslash-newline joined, comments dropped, split at newline and `;`
// outside quotes and parentheses (an array literal or $( ) may span lines).

struct Statement {
  std::string text;
  int line = 0;  // first line, 1-based
};

std::vector<Statement> split_statements(const std::string& in, const std::string& source) {
  std::vector<Statement> out;
  std::string cur;
  int line = 1, start_line = 1;
  int depth = 0, brace = 0;
  char quote = 0;
  int quote_line = 0;
  auto flush = [&] {
    size_t b = 0;
    while (b < cur.size() && is_space(cur[b])) ++b;
    if (b < cur.size()) out.push_back({cur.substr(b), start_line});
    cur.clear();
  };
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (cur.find_first_not_of(" \t\r\n") == std::string::npos) start_line = line;
    if (quote == '\'') {
      cur += c;
      if (c == '\n') ++line;
      if (c == '\'') quote = 0;
      continue;
    }
    if (c == '\\' && i + 1 < in.size()) {
      if (in[i + 1] == '\n') {  // line continuation
        ++i;
        ++line;
        continue;
      }
      cur += c;
      cur += in[++i];
      continue;
    }
    if (quote == '"') {
      cur += c;
      if (c == '\n') ++line;
      if (c == '"') quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      quote_line = line;
      cur += c;
      continue;
    }
    // A comment starts at a word start, outside ${ }.
    if (c == '#' && brace == 0 && (cur.empty() || is_space(cur.back()) || cur.back() == ';' || cur.back() == '(')) {
      while (i + 1 < in.size() && in[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '$' && i + 1 < in.size() && in[i + 1] == '{') {
      ++brace;
      cur += "${";
      ++i;
      continue;
    }
    if (c == '}' && brace > 0) --brace;
    if (c == '(') ++depth;
    if (c == ')' && depth > 0) --depth;
    if (c == '\n') {
      ++line;
      if (depth == 0) {
        flush();
        continue;
      }
      cur += ' ';
      continue;
    }
    if (c == ';' && depth == 0) {
      if (i + 1 < in.size() && in[i + 1] == ';') ++i;  // `;;` of a case arm
      flush();
      continue;
    }
    cur += c;
  }
  if (quote != 0)
    throw InputError(source + ":" + std::to_string(quote_line) + ": unterminated " +
                     (quote == '"' ? std::string("double") : std::string("single")) + " quote");
  if (depth > 0) throw InputError(source + ":" + std::to_string(start_line) + ": unclosed '(' (an array or $( ))");
  flush();
  return out;
}

// Raw words of a statement: split at unquoted whitespace, outside ${ } and $( ).
std::vector<std::string> raw_words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  bool have = false;
  char quote = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote == '\'') {
      cur += c;
      if (c == '\'') quote = 0;
      continue;
    }
    if (c == '\\' && i + 1 < s.size()) {
      cur += c;
      cur += s[++i];
      have = true;
      continue;
    }
    if (quote == '"') {
      cur += c;
      if (c == '"') quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      cur += c;
      have = true;
      continue;
    }
    if (c == '$' && i + 1 < s.size() && (s[i + 1] == '{' || s[i + 1] == '(')) {
      ++depth;
      cur += c;
      cur += s[++i];
      have = true;
      continue;
    }
    if (depth > 0) {
      if (c == '{' || c == '(') ++depth;
      if (c == '}' || c == ')') --depth;
      cur += c;
      continue;
    }
    if (is_space(c)) {
      if (have) w.push_back(cur);
      cur.clear();
      have = false;
      continue;
    }
    cur += c;
    have = true;
  }
  if (have) w.push_back(cur);
  return w;
}

// ---------------------------------------------------------------------------------------
// Stage 2: variables and expansion.

struct Var {
  std::vector<std::string> items;      // a scalar is one item
  std::set<std::string> unresolved;    // unset variables its value came from
};

class Shell {
 public:
  std::map<std::string, Var> vars;
  std::set<std::string> touched;  // unset variables met since the last clear
  std::vector<std::string>* notes = nullptr;

  /// Fields of a raw word (split = false: one field, as the value of an assignment).
  std::vector<std::string> expand(const std::string& raw, bool split = true) {
    // Nested expansions (${A:-${B:-...}}) recurse: bounded, deeper text is kept as written.
    if (nesting_ > 64) return {raw};
    struct Nest {
      int& n;
      explicit Nest(int& x) : n(++x) {}
      ~Nest() { --n; }
    } nest(nesting_);
    std::vector<std::string> fields;
    std::string cur;
    bool exists = false;
    auto push = [&] {
      fields.push_back(cur);
      cur.clear();
      exists = false;
    };
    // Unquoted expansion result: split on whitespace (elements are separate words anyway).
    auto add_unquoted = [&](const std::vector<std::string>& items) {
      if (!split) {
        std::string j;
        for (size_t k = 0; k < items.size(); ++k) j += (k ? " " : "") + items[k];
        cur += j;
        exists = exists || !j.empty();
        return;
      }
      for (size_t k = 0; k < items.size(); ++k) {
        const std::string& v = items[k];
        if (k > 0 && (exists || !cur.empty())) push();
        size_t p = 0;
        bool first = true;
        if (!v.empty() && is_space(v.front()) && (exists || !cur.empty())) push();
        while (p < v.size()) {
          while (p < v.size() && is_space(v[p])) ++p;
          if (p >= v.size()) break;
          size_t e = p;
          while (e < v.size() && !is_space(v[e])) ++e;
          if (!first) push();
          cur += v.substr(p, e - p);
          exists = true;
          first = false;
          p = e;
        }
        if (!v.empty() && is_space(v.back()) && (exists || !cur.empty())) push();
      }
    };
    auto add_quoted = [&](const std::vector<std::string>& items, bool as_elements) {
      if (!as_elements || !split) {
        std::string j;
        for (size_t k = 0; k < items.size(); ++k) j += (k ? " " : "") + items[k];
        cur += j;
        exists = true;
        return;
      }
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) push();
        cur += items[k];
        exists = true;
      }
    };
    char quote = 0;
    for (size_t i = 0; i < raw.size(); ++i) {
      const char c = raw[i];
      if (quote == 0 && c == '\'') {
        const size_t e = raw.find('\'', i + 1);
        const size_t end = e == std::string::npos ? raw.size() : e;
        cur += raw.substr(i + 1, end - i - 1);
        exists = true;
        i = end;
        continue;
      }
      if (c == '"') {
        quote = quote == '"' ? 0 : '"';
        exists = true;
        continue;
      }
      if (c == '\\' && i + 1 < raw.size()) {
        const char n = raw[i + 1];
        if (quote == 0 || n == '"' || n == '\\' || n == '$' || n == '`') {
          cur += n;
          ++i;
          exists = true;
          continue;
        }
        cur += c;
        continue;
      }
      if (c == '$' && i + 1 < raw.size()) {
        bool elements = false;
        std::optional<std::vector<std::string>> v = expansion(raw, i, elements);
        if (v) {
          if (quote == '"') add_quoted(*v, elements);
          else add_unquoted(*v);
          continue;
        }
      }
      cur += c;
      exists = exists || quote == 0;
      if (quote == '"') exists = true;
    }
    if (exists || !cur.empty()) fields.push_back(cur);
    return fields;
  }

  std::string expand_scalar(const std::string& raw) {
    const auto f = expand(raw, false);
    return f.empty() ? std::string() : f.front();
  }

 private:
  int nesting_ = 0;
  /// Index of the bracket closing the one at `open` (same kind), or npos.
  static size_t matching(const std::string& s, size_t open, char o, char c) {
    int d = 0;
    char quote = 0;
    for (size_t i = open; i < s.size(); ++i) {
      if (quote) {
        if (s[i] == quote) quote = 0;
        continue;
      }
      if (s[i] == '\'' || s[i] == '"') {
        quote = s[i];
        continue;
      }
      if (s[i] == o) ++d;
      if (s[i] == c && --d == 0) return i;
    }
    return std::string::npos;
  }

  std::vector<std::string> unset_text(const std::string& name, const std::string& text) {
    touched.insert(name);
    return {text};
  }

  std::optional<Var> lookup(const std::string& name) {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    touched.insert(it->second.unresolved.begin(), it->second.unresolved.end());
    return it->second;
  }

  /// The expansion starting at raw[i] == '$'; i is left on its last character. nullopt: a
  /// lone '$' (kept as text).
  std::optional<std::vector<std::string>> expansion(const std::string& raw, size_t& i, bool& elements) {
    const size_t start = i;
    if (raw.compare(i, 3, "$((") == 0) {
      const size_t e = raw.find("))", i + 3);
      if (e != std::string::npos) {
        const std::string expr = expand_scalar(raw.substr(i + 3, e - i - 3));
        i = e + 1;
        if (auto v = arithmetic(expr)) return std::vector<std::string>{std::to_string(*v)};
        touched.insert(raw.substr(start, i + 1 - start));
        return std::vector<std::string>{raw.substr(start, i + 1 - start)};
      }
    }
    if (raw[i + 1] == '(') {
      const size_t e = matching(raw, i + 1, '(', ')');
      i = e == std::string::npos ? raw.size() - 1 : e;
      const std::string text = raw.substr(start, i + 1 - start);
      return unset_text(text, text);
    }
    if (raw[i + 1] == '{') {
      const size_t e = matching(raw, i + 1, '{', '}');
      if (e == std::string::npos) return std::nullopt;
      i = e;
      const std::string inner = raw.substr(start + 2, e - start - 2);
      const std::string text = raw.substr(start, e + 1 - start);
      size_t n = 0;
      if (!inner.empty() && inner[0] == '#') return unset_text(text, text);  // lengths: not needed
      while (n < inner.size() && (is_name_char(inner[n]))) ++n;
      const std::string name = inner.substr(0, n);
      const std::string rest = inner.substr(n);
      if (name.empty()) return unset_text(text, text);
      if (rest == "[@]" || rest == "[*]") {
        elements = rest == "[@]";
        auto v = lookup(name);
        if (!v) return unset_text(name, text);
        return v->items;
      }
      if (rest.size() > 2 && rest.front() == '[' && rest.back() == ']') {
        auto v = lookup(name);
        const std::string idx = rest.substr(1, rest.size() - 2);
        if (v && !idx.empty() && idx.size() < 10 && std::all_of(idx.begin(), idx.end(), ::isdigit)) {
          const size_t k = std::stoul(idx);
          return std::vector<std::string>{k < v->items.size() ? v->items[k] : ""};
        }
        return unset_text(name, text);
      }
      if (rest.empty()) {
        auto v = lookup(name);
        if (!v) return unset_text(name, text);
        return std::vector<std::string>{v->items.empty() ? "" : v->items.front()};
      }
      for (const char* op : {":-", ":=", "-", "=", ":+", "+"}) {
        if (rest.rfind(op, 0) != 0) continue;
        const std::string o = op;
        const std::string word = rest.substr(o.size());
        auto it = vars.find(name);
        const bool set = it != vars.end() && !(o[0] == ':' && (it->second.items.empty() || it->second.items[0].empty()));
        if (o.back() == '+') return std::vector<std::string>{set ? expand_scalar(word) : ""};
        if (set) return std::vector<std::string>{lookup(name)->items.front()};
        std::string d = expand_scalar(word);
        if (o.back() == '=') vars[name] = Var{{d}, {}};
        return std::vector<std::string>{d};
      }
      return unset_text(name, text);  // other operators (${X/a/b}, ${X%.*}, ...)
    }
    size_t n = i + 1;
    if (std::isdigit(static_cast<unsigned char>(raw[n])) || raw[n] == '@' || raw[n] == '*' || raw[n] == '#' ||
        raw[n] == '?' || raw[n] == '$' || raw[n] == '!') {
      i = n;
      const std::string text = raw.substr(start, 2);
      return unset_text(text, text);
    }
    if (!is_name_start(raw[n])) return std::nullopt;
    while (n < raw.size() && is_name_char(raw[n])) ++n;
    const std::string name = raw.substr(i + 1, n - i - 1);
    i = n - 1;
    auto v = lookup(name);
    if (!v) return unset_text(name, "$" + name);
    return std::vector<std::string>{v->items.empty() ? "" : v->items.front()};
  }

  // Integer arithmetic: + - * / % and parentheses, names read as variables.
  std::optional<int64_t> arithmetic(const std::string& e) {
    size_t p = 0;
    bool ok = true;
    int depth = 0;
    std::function<int64_t()> sum, product, unary;
    auto skip = [&] {
      while (p < e.size() && is_space(e[p])) ++p;
    };
    std::function<int64_t()> primary;
    unary = [&]() -> int64_t {
      skip();
      bool neg = false;
      while (p < e.size() && (e[p] == '-' || e[p] == '+')) {  // a loop: no recursion per sign
        if (e[p] == '-') neg = !neg;
        ++p;
        skip();
      }
      const int64_t x = primary();
      if (neg && x == INT64_MIN) ok = false;
      return neg && x != INT64_MIN ? -x : x;
    };
    primary = [&]() -> int64_t {
      if (p < e.size() && e[p] == '(') {
        ++p;
        if (++depth > 64) {
          ok = false;
          p = e.size();
          return 0;
        }
        const int64_t v = sum();
        --depth;
        skip();
        if (p < e.size() && e[p] == ')') ++p;
        else ok = false;
        return v;
      }
      if (p < e.size() && std::isdigit(static_cast<unsigned char>(e[p]))) {
        int64_t v = 0;
        while (p < e.size() && std::isdigit(static_cast<unsigned char>(e[p]))) {
          if (v > (INT64_MAX - 9) / 10) ok = false;
          else v = v * 10 + (e[p] - '0');
          ++p;
        }
        return v;
      }
      if (p < e.size() && is_name_start(e[p])) {
        size_t q = p;
        while (q < e.size() && is_name_char(e[q])) ++q;
        const std::string name = e.substr(p, q - p);
        p = q;
        auto v = lookup(name);
        if (!v || v->items.empty()) {
          ok = false;
          touched.insert(name);
          return 0;
        }
        try {
          size_t used = 0;
          const int64_t x = std::stoll(v->items.front(), &used);
          if (used != v->items.front().size()) ok = false;
          return x;
        } catch (...) {
          ok = false;
          return 0;
        }
      }
      ok = false;
      return 0;
    };
    product = [&]() -> int64_t {
      int64_t v = unary();
      for (;;) {
        skip();
        if (p >= e.size() || (e[p] != '*' && e[p] != '/' && e[p] != '%')) return v;
        const char op = e[p++];
        const int64_t r = unary();
        if (op == '*') {
          if (__builtin_mul_overflow(v, r, &v)) ok = false;
        } else if (r == 0 || (r == -1 && v == INT64_MIN)) {
          ok = false;
        } else {
          v = op == '/' ? v / r : v % r;
        }
      }
    };
    sum = [&]() -> int64_t {
      int64_t v = product();
      for (;;) {
        skip();
        if (p >= e.size() || (e[p] != '+' && e[p] != '-')) return v;
        const char op = e[p++];
        const int64_t r = product();
        if (op == '+' ? __builtin_add_overflow(v, r, &v) : __builtin_sub_overflow(v, r, &v)) ok = false;
      }
    };
    const int64_t v = sum();
    skip();
    if (!ok || p != e.size()) return std::nullopt;
    return v;
  }
};

// NAME=VALUE / NAME+=VALUE at the start of a raw word: the name, whether it appends, and the
// value's position.
struct AssignHead {
  std::string name;
  bool append = false;
  size_t value_at = 0;
};
std::optional<AssignHead> assignment_head(const std::string& w) {
  if (w.empty() || !is_name_start(w[0])) return std::nullopt;
  size_t n = 1;
  while (n < w.size() && is_name_char(w[n])) ++n;
  AssignHead h{w.substr(0, n), false, 0};
  if (n < w.size() && w[n] == '+') {
    h.append = true;
    ++n;
  }
  if (n >= w.size() || w[n] != '=') return std::nullopt;
  h.value_at = n + 1;
  return h;
}

const std::set<std::string> kLaunchers = {"torchrun", "python",  "python3",    "deepspeed", "srun", "mpirun",
                                          "uv",       "accelerate", "nsys", "numactl",   "exec", "env"};

std::string basename_of(const std::string& w) {
  const size_t s = w.rfind('/');
  return s == std::string::npos ? w : w.substr(s + 1);
}
bool ends_with_py(const std::string& w) { return w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0; }

// Shell operators after which the launch command's own words end.
bool ends_command(const std::string& w) {
  return w == "&&" || w == "||" || w == "|" || w == "|&" || w == "&" || w == ";" || w.rfind(">", 0) == 0 ||
         w.rfind("2>", 0) == 0 || w.rfind("1>", 0) == 0 || w.rfind("&>", 0) == 0 || w.rfind("<", 0) == 0;
}

enum class FrameKind { cond, skipped };
struct Frame {
  FrameKind kind = FrameKind::cond;
  bool parent_active = true;
  bool taken = false;
  bool active = true;
};

// Evaluates an `if` / `elif` condition (expanded words). nullopt: undecidable.
std::optional<bool> condition(const std::vector<std::string>& raw, Shell& sh) {
  // Groups joined by && / ||, each [ ... ] / [[ ... ]] with an optional leading !.
  std::optional<bool> acc;
  std::string pending_op;
  size_t i = 0;
  while (i < raw.size()) {
    bool neg = false;
    while (i < raw.size() && raw[i] == "!") {
      neg = !neg;
      ++i;
    }
    if (i >= raw.size()) return std::nullopt;
    const std::string open = raw[i];
    if (open != "[" && open != "[[") return std::nullopt;
    const std::string close = open == "[" ? "]" : "]]";
    size_t j = i + 1;
    while (j < raw.size() && raw[j] != close) ++j;
    if (j >= raw.size()) return std::nullopt;
    // Short circuit, as bash: true || X and false && X do not evaluate X.
    if (acc && ((pending_op == "||" && *acc) || (pending_op == "&&" && !*acc))) {
      i = j + 1;
      if (i < raw.size()) {
        if (raw[i] != "&&" && raw[i] != "||") return std::nullopt;
        pending_op = raw[i++];
      }
      continue;
    }
    sh.touched.clear();
    std::vector<std::string> t;
    for (size_t k = i + 1; k < j; ++k) {
      auto f = sh.expand(raw[k], false);
      t.push_back(f.empty() ? std::string() : f.front());
    }
    if (!sh.touched.empty()) return std::nullopt;  // tests on unset variables: undecided
    std::optional<bool> g;
    bool inner_neg = false;
    if (!t.empty() && t[0] == "!") {
      inner_neg = true;
      t.erase(t.begin());
    }
    if (t.size() == 3 && (t[1] == "==" || t[1] == "=")) g = t[0] == t[2];
    else if (t.size() == 3 && t[1] == "!=") g = t[0] != t[2];
    else if (t.size() == 2 && t[0] == "-n") g = !t[1].empty();
    else if (t.size() == 2 && t[0] == "-z") g = t[1].empty();
    else if (t.size() == 1) g = !t[0].empty();
    if (!g) return std::nullopt;
    bool v = *g != inner_neg;
    if (neg) v = !v;
    if (!acc) acc = v;
    else if (pending_op == "&&") acc = *acc && v;
    else acc = *acc || v;
    i = j + 1;
    if (i < raw.size()) {
      if (raw[i] != "&&" && raw[i] != "||") return std::nullopt;
      pending_op = raw[i++];
    }
  }
  return acc;
}

std::string joined(const std::vector<std::string>& w, size_t from = 0) {
  std::string s;
  for (size_t i = from; i < w.size(); ++i) s += (i > from ? " " : "") + w[i];
  return s;
}

}  // namespace

LaunchCommand launch_from_words(const std::vector<std::string>& words) {
  LaunchCommand c;
  size_t py = words.size();
  for (size_t i = 0; i < words.size(); ++i)
    if (ends_with_py(words[i]) && (i == 0 || words[i - 1].rfind("--", 0) != 0 || i + 1 < words.size())) {
      py = i;
      break;
    }
  if (py == words.size()) {
    c.args = words;
    return c;
  }
  c.launcher.assign(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(py));
  c.script = words[py];
  for (size_t i = py + 1; i < words.size() && !ends_command(words[i]); ++i) c.args.push_back(words[i]);
  return c;
}

LaunchCommand read_launch_script(const std::string& text, const std::string& source) {
  // CRLF (Windows) line endings: bash reads each carriage return as part of the last word of
  // its line, so no continuation continues and every flag value ends in \r. Refused, naming
  // the first such line, rather than read as something else.
  if (const size_t cr = text.find("\r\n"); cr != std::string::npos)
    throw InputError(source + ":" + std::to_string(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(cr), '\n')) +
                     ": CRLF (Windows) line endings, which bash does not run as written (its backslash continuations "
                     "end in a carriage return); convert the file to LF line endings (e.g. dos2unix)");
  const std::vector<Statement> statements = split_statements(text, source);
  Shell sh;
  std::vector<std::string> notes;
  sh.notes = &notes;
  std::vector<Frame> stack;
  std::optional<LaunchCommand> launch;
  int launch_line = 0, launches = 0;
  auto active = [&] { return stack.empty() || stack.back().active; };
  auto where = [&](int line) { return source + ":" + std::to_string(line); };
  // A variable (or the command) may not grow past 1 MiB of text: a launch command is a few
  // kilobytes, and a script doubling a variable line by line (X1="$X0 $X0", ...) reaches
  // gigabytes in thirty lines.
  constexpr size_t kMaxExpandedBytes = size_t{1} << 20;
  auto check_expanded_size = [&](const std::string& name, const std::vector<std::string>& items, int line) {
    size_t bytes = 0;
    for (const auto& i : items) bytes += i.size() + 1;
    if (bytes > kMaxExpandedBytes)
      throw InputError(where(line) + ": " + (name.empty() ? std::string("the command") : "variable " + name) +
                       " expands to more than 1 MiB of text (" + std::to_string(bytes) +
                       " bytes): a launch command is a few kilobytes");
  };

  for (size_t si = 0; si < statements.size(); ++si) {
    const Statement& st = statements[si];
    std::vector<std::string> w = raw_words(st.text);
    if (w.empty()) continue;
    // A statement that starts with a flag is no command: the flags of a launch whose line
    // continuation broke (a space after the backslash, or none), which bash would run as a
    // command of their own and the launch would lose.
    if (w[0].size() > 2 && w[0].compare(0, 2, "--") == 0)
      throw InputError(where(st.line) + ": starts with the flag " + w[0].substr(0, 80) +
                       ", not a command: is the line continuation before it broken (a space after the backslash, "
                       "or no backslash)?");
    // Keywords that open, continue or close blocks (tracked even where inactive).
    const std::string& k = w[0];
    if (k == "if" || k == "elif") {
      const std::vector<std::string> cond(w.begin() + 1, w.end());
      if (k == "if") {
        Frame f;
        f.parent_active = active();
        f.active = false;
        stack.push_back(f);
      } else if (stack.empty() || stack.back().kind != FrameKind::cond) {
        throw InputError(where(st.line) + ": 'elif' without 'if'");
      }
      Frame& f = stack.back();
      if (f.parent_active && !f.taken) {
        std::optional<bool> v = condition(cond, sh);
        if (!v) notes.push_back(where(st.line) + ": condition `" + joined(cond) + "` not decided (taken as false)");
        f.active = v.value_or(false);
        f.taken = f.active;
      } else {
        f.active = false;
      }
      continue;
    }
    if (k == "else") {
      if (stack.empty() || stack.back().kind != FrameKind::cond) throw InputError(where(st.line) + ": 'else' without 'if'");
      Frame& f = stack.back();
      f.active = f.parent_active && !f.taken;
      f.taken = true;
      w.erase(w.begin());
      if (w.empty()) continue;
    } else if (k == "fi" || k == "done" || k == "esac" || k == "}") {
      if (!stack.empty()) stack.pop_back();
      continue;
    } else if (k == "then" || k == "do") {
      w.erase(w.begin());
      if (w.empty()) continue;
    } else if (k == "for" || k == "while" || k == "until" || k == "case" || k == "select" || k == "function" ||
               (k.size() > 2 && k.compare(k.size() - 2, 2, "()") == 0 &&
                std::all_of(k.begin(), k.end() - 2, is_name_char)) ||
               (w.size() >= 2 && w[1] == "()")) {
      if (active()) notes.push_back(where(st.line) + ": `" + k + "` block skipped (loops, case and functions are not run)");
      Frame f;
      f.kind = FrameKind::skipped;
      f.parent_active = active();
      f.active = false;
      stack.push_back(f);
      continue;
    }
    if (!active()) continue;

    // Assignments, with an optional declaration keyword before them.
    size_t first = 0;
    if (w[0] == "export" || w[0] == "declare" || w[0] == "local" || w[0] == "readonly" || w[0] == "typeset") {
      first = 1;
      while (first < w.size() && w[first].rfind("-", 0) == 0) ++first;
      if (first >= w.size()) continue;
    }
    std::optional<AssignHead> head = assignment_head(w[first]);
    if (head && w[first].compare(head->value_at, 1, "(") == 0) {
      // Array literal: the words between "NAME=(" and the closing ")".
      std::string body = w[first].substr(head->value_at + 1);
      std::vector<std::string> items_raw;
      std::vector<std::string> rest(w.begin() + static_cast<std::ptrdiff_t>(first) + 1, w.end());
      if (!body.empty()) rest.insert(rest.begin(), body);
      bool closed = false;
      for (std::string r : rest) {
        if (closed) break;
        if (!r.empty() && r.back() == ')') {
          r.pop_back();
          closed = true;
        }
        if (!r.empty()) items_raw.push_back(r);
      }
      sh.touched.clear();
      Var v;
      if (head->append) {
        auto it = sh.vars.find(head->name);
        if (it != sh.vars.end()) v = it->second;
      }
      for (const auto& r : items_raw)
        for (auto& f : sh.expand(r, true)) v.items.push_back(f);
      check_expanded_size(head->name, v.items, st.line);
      v.unresolved.insert(sh.touched.begin(), sh.touched.end());
      sh.vars[head->name] = v;
      continue;
    }
    if (head) {
      // NAME=VALUE [NAME2=VALUE2 ...] [command]: assignments alone set variables; before a
      // command they only set its environment.
      size_t n = first;
      while (n < w.size() && assignment_head(w[n])) ++n;
      if (n == w.size()) {
        for (size_t a = first; a < n; ++a) {
          const AssignHead h = *assignment_head(w[a]);
          sh.touched.clear();
          const std::string val = sh.expand_scalar(w[a].substr(h.value_at));
          Var& v = sh.vars[h.name];
          if (h.append && !v.items.empty()) v.items.front() += val;
          else v.items = {val};
          check_expanded_size(h.name, v.items, st.line);
          if (!h.append) v.unresolved.clear();
          v.unresolved.insert(sh.touched.begin(), sh.touched.end());
        }
        continue;
      }
      w.erase(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(n));
    }
    if (first == 1 && !head) continue;  // `export NAME` alone

    // A command: the launch command when its program is a launcher or a *.py file.
    const std::string prog = basename_of(w[0]);
    if (!kLaunchers.count(prog) && !ends_with_py(prog)) continue;
    sh.touched.clear();
    std::vector<std::string> words;
    for (const auto& r : w)
      for (auto& f : sh.expand(r, true)) words.push_back(f);
    check_expanded_size("", words, st.line);
    LaunchCommand c = launch_from_words(words);
    if (c.script.empty()) continue;  // e.g. `python -c ...`, `python3 tools/x` without a .py
    ++launches;
    for (const auto& name : sh.touched)
      c.notes.push_back(name.rfind("$", 0) == 0 ? "`" + name + "` is not set by the script (kept as text)"
                                                : "variable " + name + " is not set by the script (kept as text)");
    launch = c;
    launch_line = st.line;
  }
  if (!launch)
    throw InputError(source + ": no launch command found (a line running a *.py script with torchrun, python, "
                              "deepspeed, srun, ...); give the flags after `--` instead");
  LaunchCommand out = *launch;
  if (launches > 1)
    notes.push_back(where(launch_line) + ": " + std::to_string(launches) +
                    " launch commands run; the last one (this line) was imported");
  out.notes.insert(out.notes.begin(), notes.begin(), notes.end());
  return out;
}

}  // namespace dtsim
