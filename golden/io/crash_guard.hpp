// crash_guard.hpp -- a corrupt HDF5 file must end in an error message, never in a crash.
//
// libhdf5 (Debian's 1.10.8) crashes on some corrupt files before it can report an error:
// fuzzing found use-after-free, buffer overflows and SEGVs inside H5Aexists
// (docs/reliability.md, "libhdf5's crashes"). k4 cannot fix libhdf5, so its command-line
// tools run each command in a child process and watch it:
//
//   - the child dies of SIGSEGV / SIGBUS / SIGFPE / SIGILL / SIGABRT (or a sanitizer report)
//     with a frame of libhdf5 on its stack: the HDF5 file it last called libhdf5 on is corrupt.
//     The parent prints "TOOL: error: libhdf5 1.10.8 crashed (SIGSEGV) on HDF5 file 'F': ..."
//     and exits 2 (bad input), like every other corrupt file.
//   - the child dies of such a signal elsewhere: a bug in k4. "TOOL: internal error: ...",
//     exit 70 (EX_SOFTWARE); the child's core dump, if enabled, is the child's.
//   - the child is killed from outside (SIGKILL, the OOM killer, a forwarded SIGINT / SIGTERM /
//     SIGHUP / SIGQUIT): the parent dies of the same signal, so that shells and CI see what
//     they saw before.
// In every case the parent then removes the temporaries of the outputs the child had begun
// (AtomicOutput notes them): a crashed run leaves no partial output, as docs/reliability.md
// promises. The child runs with PR_SET_PDEATHSIG: killing the parent kills it too.
//
// K4_NO_GUARD=1 runs the command in the process itself (for a debugger). K4_GUARD_SELFTEST=
// libhdf5 (or k4) makes the child crash inside libhdf5 (or in k4's code) before the command:
// the check that a build's guard tells the two apart (exit 2 / exit 70). libhdf5's code is
// found as a shared library (Debian's build) or, linked statically (the device build), as the
// span of the program's H5* functions in its symbol table; in a stripped static binary its
// crashes read as internal errors (exit 70, still no signal, still no partial output).
#pragma once
#include <functional>
#include <string>

namespace k4::guard {

// What run() makes of a child that ended; exposed for the tests.
enum class Outcome { Exited, CorruptHdf5, InternalCrash, Killed };

// Runs FN in a child process (or here, with K4_NO_GUARD=1) and returns the exit status for
// main: FN's own, 2 for a crash inside libhdf5, 70 for another crash; a killed child kills
// the caller with the same signal. TOOL prefixes the messages ("k4 diff").
int run(const std::string& tool, const std::function<int()>& fn);

// The same, but returns instead of dying when the child was killed: the outcome, the exit
// status run() would give (the signal number for Killed) and the message printed.
struct Result {
  Outcome outcome = Outcome::Exited;
  int status = 0;
  std::string message;
};
Result run_child(const std::string& tool, const std::function<int()>& fn);

// The HDF5 layer calls this before each libhdf5 call on FILE's objects (cheap: a copy into
// a shared page, and nothing at all outside a guarded child).
void note_hdf5_file(const std::string& file);

// AtomicOutput calls this for each output it begins: if the child dies, the parent removes
// PATH's temporaries.
void note_output(const std::string& path);

// The pid that names this process's output temporaries (".NAME.tmp-PID"): the guarded
// parent's in a guarded child (so that a temporary outlives neither a killed parent nor its
// child in the stale check), getpid() otherwise.
int owner_pid();

// True if PC lies in libhdf5's code (the test of the classification).
bool in_libhdf5(const void* pc);

// Installs the crash classification in this process without a child: on a crash with libhdf5
// on the stack, ON_HDF5 runs (in the signal handler: async-signal-safe work only) and the
// process _exit(0)s; any other crash goes on to the handler installed before. The fuzz
// target of raw HDF5 bytes uses it to tell libhdf5's crashes (handled by run()) from ours.
void install_in_process(void (*on_hdf5)(int signo));

}  // namespace k4::guard
