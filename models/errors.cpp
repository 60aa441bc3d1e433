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

void ProblemList::annotate_from(size_t first, const std::vector<std::string>& keys, const std::string& note) {
  const std::string lead = file_ + ": ";
  for (size_t i = first; i < problems_.size(); ++i) {
    std::string& line = problems_[i];
    const size_t at = line.compare(0, lead.size(), lead) == 0 ? lead.size() : 0;
    for (const auto& k : keys)
      if (line.compare(at, k.size(), k) == 0) {
        line += note;
        break;
      }
  }
}

}  // namespace dtsim
