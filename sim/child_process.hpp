#pragma once
// SimGrid keeps one engine per process (its clock and configuration are global,
// ../shared/design/SIMGRID.md "One engine per process"), so every simulation that must
// not disturb its caller runs in a forked child that returns its result as text.
//
// Fork safety. A child made by fork() holds a copy of the whole address space but only of
// the calling thread: a lock another thread held at that moment (malloc's, the sanitizer
// allocator's, a logger's) stays locked in the child forever, so POSIX allows the child of
// a multithreaded process only async-signal-safe functions until it calls exec (POSIX.1-2017
// fork(), APPLICATION USAGE). A simulation child allocates, so it must come from a process
// with one thread. glibc's malloc happens to survive the multithreaded case (it takes its
// arena locks around fork); GCC 12's AddressSanitizer allocator does not (it gained
// pthread_atfork handlers only in LLVM 18, llvm/llvm-project#75290; google/sanitizers#774),
// and a sweep child once deadlocked there when sweeps ran one thread per job.
// So nothing here creates threads: run_in_children runs `jobs` children at once from the
// calling thread (poll(2) on their pipes), and every fork first checks that the process has
// a single thread (std::logic_error otherwise: a programming error, never an input error).
#include <cstddef>
#include <exception>
#include <functional>
#include <string>

namespace dtsim {

/// Runs `work` in a forked child and returns the text it produced. stdio is flushed
/// before the fork. Throws std::runtime_error naming `what` when the child throws (with
/// its message), crashes or exits non-zero; std::logic_error when the process has more
/// than one thread (see above).
std::string run_in_child(const std::function<std::string()>& work, const std::string& what);

/// What one child of run_in_children produced: its text, or the error run_in_child would
/// have thrown (or the one `prepare` threw), rethrown by std::rethrow_exception(error).
struct ChildResult {
  std::string text;
  std::exception_ptr error;  // null: `text` is the child's result
};

/// Runs pieces of work 0..count-1, each in a child process of its own, at most `jobs`
/// (>= 1) at once, every child forked by the calling thread and no thread created.
/// `prepare(i)` runs in this process just before child i is forked and returns the work the
/// child runs (its exception is handed to `done` and no child is forked); `done(i, result)`
/// runs in this process as each child ends, in completion order (not index order).
/// Each child closes every inherited descriptor but 0-2 and its pipe (a sweep's flock on its
/// output directory stays with the sweep) and is killed when the calling thread dies
/// (PR_SET_PDEATHSIG), so a sweep killed with SIGKILL leaves no simulation running. When
/// `prepare` or `done` throws, the children still running are killed and reaped and the
/// exception propagates. Throws std::logic_error as run_in_child does.
void run_in_children(size_t count, int jobs, const std::function<std::function<std::string()>(size_t)>& prepare,
                     const std::function<void(size_t, ChildResult&&)>& done, const std::string& what);

}  // namespace dtsim
