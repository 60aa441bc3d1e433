#pragma once
// User text (titles, names, file names, values quoted in error messages) made safe to print
// on a terminal: control characters are shown as escapes instead of being sent raw, so an
// ANSI escape sequence in a title cannot recolour, move the cursor or retitle the terminal
// (ECMA-48: ESC and the C1 range U+0080-U+009F introduce control functions).
#include <string>
#include <string_view>

namespace dtsim {

/// `s` with C0 control characters except TAB (U+0000-U+001F: ESC becomes "\x1b", a newline
/// "\n"), DEL ("\x7f") and C1 controls (UTF-8 C2 80-C2 9F: "\u009b") escaped; everything else,
/// UTF-8 included, unchanged.
std::string printable(std::string_view s);

}  // namespace dtsim
