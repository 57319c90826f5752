// crash_guard.hpp -- a corrupt HDF5 file must end in an error message, never in a crash.
//
// libhdf5 (Debian's 1.10.8) crashes on some corrupt files before it can report an error:
// fuzzing found use-after-free, buffer overflows and SEGVs inside H5Aexists
// (docs/reliability.md). k4 cannot fix libhdf5, so its command-line tools run each command
// with signal handlers installed (on an alternate stack, async-signal-safe):
//
//   - SIGSEGV / SIGBUS / SIGFPE / SIGILL / SIGABRT (or a sanitizer report) with a frame of
//     libhdf5 on the stack: the HDF5 file k4 last called libhdf5 on is corrupt. "TOOL: error:
//     libhdf5 1.10.8 crashed (SIGSEGV) on HDF5 file 'F': ...", exit 2 (bad input), like every
//     other corrupt file.
//   - such a signal elsewhere: a bug in k4. "TOOL: internal error: ...", exit 70 (EX_SOFTWARE).
//   - SIGINT / SIGTERM / SIGHUP / SIGQUIT / SIGPIPE: k4 dies of the signal, as without the guard.
// In every case the temporaries of the outputs the command had begun (AtomicOutput notes
// them) are removed first: a crashed or interrupted run leaves no partial output. A SIGKILL
// (the OOM killer) cannot be handled: its temporary stays until the next write of that
// output removes it (golden/io/atomic_file.hpp).
//
// A debugger sees every signal before the handlers do. K4_NO_GUARD=1 installs none (a core
// dump of the crash itself). K4_GUARD_SELFTEST=libhdf5 (or k4) crashes inside libhdf5 (or
// in k4's code) before the command: the check that a build's guard tells the two apart
// (exit 2 / exit 70). libhdf5's code is found as a shared library (Debian's build) or, linked
// statically (the device build), as the program's H5* functions in its symbol table; in a
// stripped static binary its crashes read as internal errors (exit 70, no partial output).
#pragma once
#include <functional>
#include <string>

namespace k4::guard {

// Installs the handlers (unless K4_NO_GUARD=1), runs FN and returns its status for main;
// a crash ends the process with 2 (inside libhdf5) or 70 (elsewhere). TOOL prefixes the
// messages ("k4 diff").
int run(const std::string& tool, const std::function<int()>& fn);

// The HDF5 layer calls this before each libhdf5 call on FILE's objects (a copy into a
// preallocated buffer, nothing when the guard is off).
void note_hdf5_file(const std::string& file);

// AtomicOutput calls these for the temporary it writes and once it is renamed or removed.
void note_temporary(const std::string& temp);
void forget_temporary(const std::string& temp);

// True if PC lies in libhdf5's code (the test of the classification).
bool in_libhdf5(const void* pc);

// Installs the crash classification alone: on a crash with libhdf5 on the stack, ON_HDF5
// runs (in the signal handler: async-signal-safe work only) and the process _exit(0)s; any
// other crash goes on to the handler installed before. The fuzz target of raw HDF5 bytes
// uses it to tell libhdf5's crashes (handled by run()) from ours.
void install_in_process(void (*on_hdf5)(int signo));

// For a process that must outlive a corrupt file (the Python module: an interpreter, not a
// command that may end): runs FN in a forked child, with the crash classification installed
// there, and tells whether it crashed. FN's results stay in the child (it only reads what the
// caller then reads itself); an exception FN throws counts as no crash (the caller's own read
// throws it). Corrupt: libhdf5 crashed; message is the tools' after "TOOL: error: "
// ("libhdf5 1.10.8 crashed (SIGSEGV, Segmentation fault) on HDF5 file 'F': the file is
// corrupt (...).", F the file of the child's last libhdf5 call, else FILE). Crashed: k4's own code crashed ("k4 crashed (SIG...) outside libhdf5 reading
// HDF5 file 'FILE': a bug in k4, ..."). K4_NO_GUARD=1: nothing runs, Ok. K4_GUARD_SELFTEST
// (= libhdf5 or k4) crashes the child before FN, as it crashes a tool before its command. The
// caller holds the HDF5 lock (no other thread may be inside libhdf5 at the fork).
struct Probe {
  enum class Kind { Ok, Corrupt, Crashed } kind = Kind::Ok;
  std::string message;
};
Probe probe_in_child(const std::string& file, const std::function<void()>& fn);

}  // namespace k4::guard
