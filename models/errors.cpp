#include "models/errors.hpp"

namespace dtsim {

namespace {
std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) {
    if (!out.empty()) out += '\n';
    out += l;
  }
  return out;
}
}  // namespace

InputError::InputError(std::vector<std::string> problems)
    : std::runtime_error(join_lines(problems)), problems_(std::move(problems)) {}

void ProblemList::add(const std::string& message) {
  std::string line;
  line.reserve(file_.size() + 2 + message.size());
  line.append(file_).append(": ").append(message);
  problems_.push_back(std::move(line));
}

void ProblemList::throw_if_any() const {
  if (!problems_.empty()) throw InputError(problems_);
}

void ProblemList::drop_containing(const std::string& part) {
  std::erase_if(problems_, [&](const std::string& line) { return line.find(part) != std::string::npos; });
}

}  // namespace dtsim
