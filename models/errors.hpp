#pragma once
// Typed errors. Library code throws these; only the CLI turns them into messages and
// exit codes. Nothing in dtsim calls exit() or abort().
#include <stdexcept>
#include <string>
#include <vector>

namespace dtsim {

/// Bad user input: a file that cannot be read, a key that is unknown, a value that
/// violates a constraint. Carries one line per problem, each naming the file, the key
/// and the violated constraint, e.g.
/// `exp.yaml: layout.tp=3 does not divide model.heads=32`.
class InputError : public std::runtime_error {
 public:
  explicit InputError(std::vector<std::string> problems);
  explicit InputError(const std::string& problem) : InputError(std::vector<std::string>{problem}) {}
  /// One line per problem, in the order they were found.
  const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  std::vector<std::string> problems_;
};

/// Collects problems while validating so the user sees every one at once.
class ProblemList {
 public:
  explicit ProblemList(std::string file) : file_(std::move(file)) {}
  /// Adds "FILE: message".
  void add(const std::string& message);
  bool empty() const noexcept { return problems_.empty(); }
  /// The problems collected so far, one line each ("FILE: message"), in order.
  const std::vector<std::string>& problems() const noexcept { return problems_; }
  /// Throws InputError with every collected problem; does nothing when empty.
  void throw_if_any() const;
  /// Forgets the problems whose line ("FILE: message") contains `part`.
  void drop_containing(const std::string& part);
  /// Appends `note` to each problem from index `first` on whose message starts with one of
  /// `keys` (dotted key prefixes, e.g. "cluster.gpu."): says where such a value came from.
  void annotate_from(size_t first, const std::vector<std::string>& keys, const std::string& note);
  const std::string& file() const noexcept { return file_; }

 private:
  std::string file_;
  std::vector<std::string> problems_;
};

}  // namespace dtsim
