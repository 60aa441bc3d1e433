#include "models/yaml_text.hpp"

#include <optional>
#include <vector>

#include <yaml-cpp/depthguard.h>

#include "models/errors.hpp"

namespace dtsim {

namespace {

struct Where {
  size_t pos = 0;
  int line = 0, column = 0;  // 0-based, as YAML::Mark
};

Where where_at(const std::string& t, size_t pos) {
  Where w{pos, 0, 0};
  for (size_t i = 0; i < pos && i < t.size(); ++i) {
    if (t[i] == '\n') {
      ++w.line;
      w.column = 0;
    } else {
      ++w.column;
    }
  }
  return w;
}

// The end of the quoted scalar whose opening quote is at `open` (YAML 1.2 Sec 7.3: "..."
// escapes with a backslash, '...' doubles the quote), or npos when the text ends first.
size_t closing_quote(const std::string& t, size_t open) {
  const char q = t[open];
  for (size_t i = open + 1; i < t.size(); ++i) {
    if (q == '"' && t[i] == '\\') {
      ++i;
    } else if (t[i] == q) {
      if (q == '\'' && i + 1 < t.size() && t[i + 1] == '\'') {
        ++i;
        continue;
      }
      return i;
    }
  }
  return std::string::npos;
}

// A best guess, for text yaml-cpp rejected: the first quote that opens a scalar (at the start
// of a line or after ':', '-', '?', ',', '[', '{') and is never closed. Comments and the
// lines of block scalars (`|`, `>`) are skipped.
std::optional<size_t> guess_unterminated_quote(const std::string& t) {
  auto is_block_indicator = [&](size_t b, size_t e) {  // [b, e): `|`, `>-`, `|2+` ...
    if (b >= e || (t[b] != '|' && t[b] != '>')) return false;
    for (size_t k = b + 1; k < e; ++k)
      if (!(t[k] == '-' || t[k] == '+' || (t[k] >= '0' && t[k] <= '9'))) return false;
    return true;
  };
  int block_indent = -1;  // inside a block scalar: lines indented more than this belong to it
  size_t i = 0;
  while (i < t.size()) {
    // At the start of a line.
    size_t first = i;
    while (first < t.size() && t[first] == ' ') ++first;
    const int indent = static_cast<int>(first - i);
    const bool blank = first >= t.size() || t[first] == '\n' || t[first] == '#';
    if (block_indent >= 0 && (blank || indent > block_indent)) {
      const size_t nl = t.find('\n', i);
      i = nl == std::string::npos ? t.size() : nl + 1;
      continue;
    }
    block_indent = -1;
    char prev = '\n';  // last non-blank character; '\n' at the start of the line
    size_t run_begin = std::string::npos, run_end = std::string::npos;  // last non-blank run
    size_t k = first;
    for (; k < t.size() && t[k] != '\n'; ++k) {
      const char c = t[k];
      if (c == ' ' || c == '\t') continue;
      const bool after_blank = k == first || t[k - 1] == ' ' || t[k - 1] == '\t';
      if (c == '#' && after_blank) {
        while (k < t.size() && t[k] != '\n') ++k;
        break;
      }
      if (after_blank) run_begin = k;
      if ((c == '"' || c == '\'') && (prev == '\n' || prev == ':' || prev == '-' || prev == '?' || prev == ',' ||
                                      prev == '[' || prev == '{')) {
        const size_t close = closing_quote(t, k);
        if (close == std::string::npos) return k;
        k = close;  // may be on a later line: the scan goes on from there
      }
      prev = t[k];
      run_end = k + 1;
    }
    if (run_begin != std::string::npos && run_end != std::string::npos && is_block_indicator(run_begin, run_end))
      block_indent = indent;
    i = k + 1;
  }
  return std::nullopt;
}

// After a successful parse: a quoted scalar (or key) whose closing quote is missing.
std::optional<size_t> unterminated_quoted_scalar(const YAML::Node& n, const std::string& t, int depth = 0) {
  if (depth > 10000) return std::nullopt;  // yaml-cpp's own guard stops far earlier
  if (n.IsScalar()) {
    const size_t pos = static_cast<size_t>(n.Mark().pos);
    if (n.Tag() == "!" && pos < t.size() && (t[pos] == '"' || t[pos] == '\'') &&
        closing_quote(t, pos) == std::string::npos)
      return pos;
    return std::nullopt;
  }
  if (n.IsSequence()) {
    for (const auto& child : n)
      if (auto p = unterminated_quoted_scalar(child, t, depth + 1)) return p;
  } else if (n.IsMap()) {
    for (const auto& kv : n) {
      if (auto p = unterminated_quoted_scalar(kv.first, t, depth + 1)) return p;
      if (auto p = unterminated_quoted_scalar(kv.second, t, depth + 1)) return p;
    }
  }
  return std::nullopt;
}

/// Nodes of `n` with every alias expanded (each use of an anchor counts its nodes again),
/// counting stops past `cap`. yaml-cpp shares an anchored node between its aliases, so ten
/// nested anchors of nine aliases each are 359 bytes of text and 9^10 nodes to any walk.
size_t expanded_nodes(const YAML::Node& n, size_t cap, size_t count = 0) {
  ++count;
  if (count > cap) return count;
  if (n.IsSequence()) {
    for (const auto& child : n)
      if ((count = expanded_nodes(child, cap, count)) > cap) return count;
  } else if (n.IsMap()) {
    for (const auto& kv : n) {
      if ((count = expanded_nodes(kv.first, cap, count)) > cap) return count;
      if ((count = expanded_nodes(kv.second, cap, count)) > cap) return count;
    }
  }
  return count;
}

/// Nodes an input file may expand to: the largest shipped file has a few thousand.
constexpr size_t kMaxExpandedNodes = 1'000'000;

[[noreturn]] void fail_at(const std::string& source, int line, int column, const std::string& what) {
  throw InputError((source.empty() ? std::string() : source + ": ") + "invalid YAML at line " + std::to_string(line + 1) + ", column " +
                   std::to_string(column + 1) + ": " + what);
}

std::string unterminated_message(const std::string& t, size_t pos) {
  const char q = t[pos];
  return std::string("unterminated ") + (q == '"' ? "double" : "single") + "-quoted string: the " +
         (q == '"' ? "\"" : "'") + " opened here is never closed (the string would run to the end of the file)";
}

}  // namespace

YAML::Node load_yaml_document(const std::string& text, const std::string& source) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::DeepRecursion& e) {
    fail_at(source, e.mark.line, e.mark.column,
            "nesting too deep (more than " + std::to_string(e.depth()) +
                " levels of lists or maps; yaml-cpp's recursion limit): an input file needs a few levels");
  } catch (const YAML::ParserException& e) {
    if (auto open = guess_unterminated_quote(text)) {
      const Where w = where_at(text, *open);
      fail_at(source, w.line, w.column, unterminated_message(text, *open));
    }
    fail_at(source, e.mark.line, e.mark.column, e.msg);
  } catch (const YAML::Exception& e) {
    throw InputError((source.empty() ? std::string() : source + ": ") + "invalid YAML: " + e.what());
  }
  if (docs.empty()) return YAML::Node(YAML::NodeType::Null);
  for (const auto& d : docs)
    if (expanded_nodes(d, kMaxExpandedNodes) > kMaxExpandedNodes)
      throw InputError((source.empty() ? std::string() : source + ": ") +
                       "its anchors and aliases (&name, *name) expand to more than 1,000,000 YAML nodes: an input "
                       "file needs a few thousand (write the values out, or use fewer nested aliases)");
  for (const auto& d : docs)
    if (auto open = unterminated_quoted_scalar(d, text)) {
      const Where w = where_at(text, *open);
      fail_at(source, w.line, w.column, unterminated_message(text, *open));
    }
  if (docs.size() > 1) {
    const YAML::Mark m = docs[1].Mark();
    // A document mark is where its content starts; the `---` before it is what to remove.
    const std::string at = m.line >= 0 ? " (the second starts near line " + std::to_string(m.line + 1) + ")" : "";
    throw InputError((source.empty() ? std::string() : source + ": ") + "holds " + std::to_string(docs.size()) + " YAML documents separated by ---" + at +
                     ": an input file holds exactly one (remove the --- and what follows, or merge it into the "
                     "first document)");
  }
  return docs.front();
}

}  // namespace dtsim
