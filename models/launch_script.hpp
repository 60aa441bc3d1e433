#pragma once
// Reading a Megatron-LM launch command out of a shell script (`dtsim import megatron`).
//
// Not a shell: a small reader for the way launch scripts are written (Megatron-LM's own
// examples/*/train_*.sh, NeMo and cluster recipes). It understands
//  - line continuations (backslash-newline), comments (`#` at the start of a word), statement
//    separators (newline, `;`);
//  - assignments NAME=VALUE (also after `export` / `declare` / `local` / `readonly`), bash
//    arrays NAME=( ... ) and NAME+=( ... ) (elements may span lines and carry comments);
//  - expansions $NAME, ${NAME}, ${NAME:-default} / ${NAME-default} / ${NAME:=default},
//    ${ARR[@]} / ${ARR[*]} (quoted: one word per element; unquoted: split on whitespace, as
//    bash does), $(( arithmetic )) on integers, single and double quotes, backslash escapes;
//  - `if` / `elif` / `else` / `fi` whose conditions are tests on strings ([ ... ] or [[ ... ]]
//    with ==, =, !=, -n, -z, !, joined by && and ||); a condition it cannot decide (files,
//    commands) is taken as false and reported; `for` / `while` / `case` blocks and function
//    bodies are skipped and reported.
// A variable the script does not set (positional $1, environment variables) expands to its own
// text ("$1", "${SLURM_NNODES}") and is reported; a flag value that needs it then fails as an
// invalid value of that flag, naming the text.
//
// The launch command is the last statement run whose command is a launcher (torchrun, python,
// python3, deepspeed, srun, mpirun, uv, accelerate, nsys, numactl) or a *.py file, and which
// names a *.py script: the words before the script are the launcher's (torchrun --nnodes ...),
// the words after it are Megatron-LM's flags.
#include <string>
#include <vector>

namespace dtsim {

struct LaunchCommand {
  std::vector<std::string> launcher;  // words before the training script (empty for bare args)
  std::string script;                 // the *.py word ("" for bare args)
  std::vector<std::string> args;      // the training script's flags and values
  /// What the reader could not do or decided: unset variables, undecided conditions, skipped
  /// blocks, a second launch command. One line each, for the import report.
  std::vector<std::string> notes;
};

/// Reads the launch command from script text. `source` names the script in messages.
/// Throws InputError when no launch command is found or a quote / array is left open.
LaunchCommand read_launch_script(const std::string& text, const std::string& source);

/// The launch command from words already split (command-line arguments after `--`): when one
/// word is a *.py file, the words before it are the launcher's; otherwise all are flags.
LaunchCommand launch_from_words(const std::vector<std::string>& words);

}  // namespace dtsim
