// crash_guard.cpp -- see crash_guard.hpp.
#include "golden/io/crash_guard.hpp"

#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>

#include "golden/io/atomic_file.hpp"
#include "golden/io/hdf5.hpp"

// Present only in a sanitizer build (ASan, UBSan, TSan): called when a report ends the process.
extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

namespace k4::guard {
namespace {

constexpr int kMaxOutputs = 16;
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP};
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The page the child writes and the parent reads after the child has ended.
struct Shared {
  volatile sig_atomic_t crashed;   // a crash signal or a sanitizer report was seen
  volatile sig_atomic_t signo;     // its signal; 0 for a sanitizer report
  volatile sig_atomic_t in_hdf5;   // libhdf5 was on the crashing stack
  volatile sig_atomic_t finished;  // the command had returned (a report at exit: leaks)
  char hdf5_file[2048];            // the file of the last libhdf5 call
  int n_outputs;
  char outputs[kMaxOutputs][1024];
};

Shared* g_shared = nullptr;                      // set in a guarded child only
pid_t g_parent = 0;                              // the guarded child's parent
struct Range { uintptr_t lo, hi; };
constexpr int kMaxRanges = 1 << 14;
Range g_ranges[kMaxRanges];                      // sorted by lo once prepare() ran
int g_nranges = -1;                              // -1: not looked up yet
void (*g_on_hdf5)(int) = nullptr;                // in-process mode
struct sigaction g_old[NSIG];
volatile pid_t g_child = 0;
volatile sig_atomic_t g_forwarded = 0;
alignas(16) char g_altstack[1 << 16];

int add_ranges(dl_phdr_info* info, size_t, void*) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libhdf5")) return 0;
  for (int i = 0; i < info->dlpi_phnum && g_nranges < kMaxRanges; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    const uintptr_t lo = uintptr_t(info->dlpi_addr + ph.p_vaddr);
    g_ranges[g_nranges++] = {lo, lo + ph.p_memsz};
  }
  return 0;
}

int main_bias(dl_phdr_info* info, size_t, void* out) {  // the first object is the program
  *static_cast<uintptr_t*>(out) = uintptr_t(info->dlpi_addr);
  return 1;
}

// libhdf5 linked into the program (the device build links it statically): the program's
// functions named H5* in its symbol table (HDF5 names its static functions H5X__ too; k4::h5
// is mangled "_ZN2k42h5...", never "H5"), each its own range, merged where they touch. Not one
// span: gcc puts every function's cold part (".cold") at the start of .text, ours among
// HDF5's. A stripped binary has none (gpu-suite.sh strips with --keep-symbol='H5*').
void add_static_ranges() {
  const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  void* map = fstat(fd, &st) == 0 ? mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  close(fd);
  if (map == MAP_FAILED) return;
  const auto* base = static_cast<const unsigned char*>(map);
  const size_t size = size_t(st.st_size);
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(base);
  const int first = g_nranges;
  if (size >= sizeof *eh && std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_shoff &&
      eh->e_shoff + size_t(eh->e_shnum) * sizeof(ElfW(Shdr)) <= size) {
    const auto* sh = reinterpret_cast<const ElfW(Shdr)*>(base + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; ++i) {
      if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
      const ElfW(Shdr)& strs = sh[sh[i].sh_link];
      if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
      const auto* sym = reinterpret_cast<const ElfW(Sym)*>(base + sh[i].sh_offset);
      const size_t n = sh[i].sh_size / sizeof(ElfW(Sym));
      const char* names = reinterpret_cast<const char*>(base + strs.sh_offset);
      for (size_t k = 0; k < n; ++k) {
        if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || !sym[k].st_value || sym[k].st_name + 3 > strs.sh_size) continue;
        const char* name = names + sym[k].st_name;
        if (name[0] != 'H' || name[1] != '5' || g_nranges >= kMaxRanges) continue;
        g_ranges[g_nranges++] = {uintptr_t(sym[k].st_value), uintptr_t(sym[k].st_value + std::max<uint64_t>(sym[k].st_size, 1))};
      }
    }
  }
  munmap(map, size);
  uintptr_t bias = 0;
  dl_iterate_phdr(main_bias, &bias);
  std::sort(g_ranges + first, g_ranges + g_nranges, [](const Range& a, const Range& b) { return a.lo < b.lo; });
  int n = first;
  for (int i = first; i < g_nranges; ++i) {
    const Range r{g_ranges[i].lo + bias, g_ranges[i].hi + bias};
    if (n > first && r.lo <= g_ranges[n - 1].hi + 16)  // touching, or alignment padding apart
      g_ranges[n - 1].hi = std::max(g_ranges[n - 1].hi, r.hi);
    else
      g_ranges[n++] = r;
  }
  g_nranges = n;
}

// Before any handler can run: the ranges of libhdf5's code, and backtrace's unwinder loaded
// (its first call may malloc and dlopen, which a signal handler must not).
void prepare() {
  if (g_nranges >= 0) return;
  g_nranges = 0;
  dl_iterate_phdr(add_ranges, nullptr);
  if (g_nranges == 0) add_static_ranges();
  std::sort(g_ranges, g_ranges + g_nranges, [](const Range& a, const Range& b) { return a.lo < b.lo; });
  void* frames[4];
  backtrace(frames, 4);
}

uintptr_t fault_pc(void* uc) {
  if (!uc) return 0;
  const auto* u = static_cast<const ucontext_t*>(uc);
#if defined(__x86_64__)
  return uintptr_t(u->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return uintptr_t(u->uc_mcontext.pc);
#else
  (void)u;
  return 0;
#endif
}

// Async-signal-safe once prepare() ran: the faulting instruction, then every frame.
bool stack_in_hdf5(void* uc) {
  if (in_libhdf5(reinterpret_cast<const void*>(fault_pc(uc)))) return true;
  void* frames[128];
  const int n = backtrace(frames, 128);
  for (int i = 0; i < n; ++i)
    if (in_libhdf5(frames[i])) return true;
  return false;
}

void record(int signo, bool h5) {
  if (!g_shared || g_shared->crashed) return;  // the first report is the cause (ASan's abort follows it)
  g_shared->signo = signo;
  g_shared->in_hdf5 = h5;
  g_shared->crashed = 1;
}

// The child's handler: record, then die of the signal as before (SA_RESETHAND restored the
// default action; a hardware fault re-faults on return, abort() raises again).
void child_handler(int sig, siginfo_t*, void* uc) {
  record(sig, stack_in_hdf5(uc));
  if (sig != SIGSEGV && sig != SIGBUS && sig != SIGILL && sig != SIGFPE) raise(sig);
}

void chain(int sig, siginfo_t* info, void* uc) {
  const struct sigaction& old = g_old[sig];
  if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) {
    old.sa_sigaction(sig, info, uc);
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void in_process_handler(int sig, siginfo_t* info, void* uc) {
  if (stack_in_hdf5(uc)) {
    g_on_hdf5(sig);
    _exit(0);
  }
  chain(sig, info, uc);
}

void death_callback() {  // a sanitizer report is ending the child
  if (g_shared) record(0, stack_in_hdf5(nullptr));
}

void install(void (*handler)(int, siginfo_t*, void*), int flags) {
  stack_t ss{};
  ss.ss_sp = g_altstack;
  ss.ss_size = sizeof g_altstack;
  sigaltstack(&ss, nullptr);  // a stack overflow still reaches the handler
  for (int sig : kCrashSignals) {
    struct sigaction sa {};
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &g_old[sig]);
  }
}

void forward(int sig) {
  g_forwarded = sig;
  if (g_child > 0) kill(g_child, sig);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  const char* desc = strsignal(sig);
  return std::string("SIG") + (abbrev ? abbrev : std::to_string(sig).c_str()) + (desc ? std::string(", ") + desc : "");
}

bool guard_off() {
  const char* e = std::getenv("K4_NO_GUARD");
  return e && *e && std::strcmp(e, "0") != 0;
}

std::string crash_message(const std::string& tool, const Shared& sh, bool corrupt, int n_removed) {
  const std::string what = sh.signo ? signal_name(sh.signo) : std::string("a sanitizer report");
  const std::string removed = n_removed > 0 ? " Its unfinished outputs were removed." : "";
  if (corrupt) {
    const std::string file = sh.hdf5_file[0] ? "HDF5 file '" + std::string(sh.hdf5_file) + "'" : "an HDF5 file";
    return tool + ": error: libhdf5 " + h5::library_version() + " crashed (" + what + ") on " + file +
           ": the file is corrupt (libhdf5 crashes on some damaged files before it can report an error; k4 ran the "
           "command in a child process to tell you)." + removed;
  }
  if (sh.finished)
    return tool + ": internal error: " + what + " after the command had finished (a sanitizer report at exit, "
           "such as leaks): a bug in k4, not in your files." + removed;
  return tool + ": internal error: k4 crashed (" + what + ") outside libhdf5: a bug in k4, not in your files; "
         "please report it with the command line (K4_NO_GUARD=1 runs it in one process, for a debugger)." + removed;
}

// K4_GUARD_SELFTEST=libhdf5 | k4: the child crashes inside libhdf5 (a bad pointer handed to
// H5Sget_simple_extent_dims, which writes through it) or in our code, before the command: the
// check that this binary's guard classifies both (the static device build included).
void self_test() {
  const char* t = std::getenv("K4_GUARD_SELFTEST");
  if (!t || !*t) return;
  if (std::strcmp(t, "libhdf5") == 0) {
    note_hdf5_file("K4_GUARD_SELFTEST");
    const hsize_t dims[1] = {4};
    H5Sget_simple_extent_dims(H5Screate_simple(1, dims, nullptr), reinterpret_cast<hsize_t*>(uintptr_t(8)), nullptr);
  } else if (std::strcmp(t, "k4") == 0) {
    // an unmapped page, not null: a fault in every build (UBSan would report a null store
    // itself and exit 1, outside our death callback: its runtime has its own)
    volatile int* volatile p = reinterpret_cast<volatile int*>(uintptr_t(16));  // (opaque to -Warray-bounds)
    *p = 1;
  }
}

[[noreturn]] void child_main(Shared* sh, pid_t parent, const std::function<int()>& fn) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the parent died before prctl
  g_shared = sh;
  g_parent = parent;
  install(child_handler, SA_RESETHAND);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(death_callback);
  int rc = 1;
  try {
    self_test();
    rc = fn();
  } catch (...) {  // fn is main's body and catches what it expects; this is the last resort
    std::fprintf(stderr, "k4: internal error: an exception escaped the command\n");
    rc = 70;
  }
  sh->finished = 1;
  std::fflush(nullptr);
  std::exit(rc);
}

}  // namespace

int owner_pid() { return g_parent ? g_parent : getpid(); }

bool in_libhdf5(const void* pc) {
  if (g_nranges < 0) prepare();  // not from a handler: prepare() ran before any was installed
  const uintptr_t p = reinterpret_cast<uintptr_t>(pc);
  int lo = 0, hi = g_nranges;  // the last range starting at or below p
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (g_ranges[mid].lo <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && p < g_ranges[lo - 1].hi;
}

void note_hdf5_file(const std::string& file) {
  if (!g_shared) return;
  const size_t n = std::min(file.size(), sizeof g_shared->hdf5_file - 1);
  std::memcpy(g_shared->hdf5_file, file.data(), n);
  g_shared->hdf5_file[n] = 0;
}

void note_output(const std::string& path) {
  if (!g_shared || g_shared->n_outputs >= kMaxOutputs || path.size() >= sizeof g_shared->outputs[0]) return;
  for (int i = 0; i < g_shared->n_outputs; ++i)
    if (path == g_shared->outputs[i]) return;
  std::memcpy(g_shared->outputs[g_shared->n_outputs], path.c_str(), path.size() + 1);
  ++g_shared->n_outputs;
}

void install_in_process(void (*on_hdf5)(int)) {
  prepare();
  g_on_hdf5 = on_hdf5;
  install(in_process_handler, 0);
}

Result run_child(const std::string& tool, const std::function<int()>& fn) {
  if (guard_off()) return {Outcome::Exited, fn(), ""};
  prepare();
  void* page = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return {Outcome::Exited, fn(), ""};  // no guard rather than no run
  auto* sh = new (page) Shared{};
  std::fflush(nullptr);  // buffered output must not be written twice
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    munmap(page, sizeof(Shared));
    return {Outcome::Exited, fn(), ""};
  }
  if (pid == 0) child_main(sh, parent, fn);

  g_child = pid;
  g_forwarded = 0;
  struct sigaction old[sizeof kForwarded / sizeof *kForwarded];
  for (size_t i = 0; i < sizeof kForwarded / sizeof *kForwarded; ++i) {
    struct sigaction sa {};
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sigaction(kForwarded[i], &sa, &old[i]);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  for (size_t i = 0; i < sizeof kForwarded / sizeof *kForwarded; ++i) sigaction(kForwarded[i], &old[i], nullptr);
  g_child = 0;

  int n_removed = 0;
  for (int i = 0; i < sh->n_outputs; ++i) {  // the child is gone: its temporaries (named with this pid) too
    std::error_code ec;
    n_removed += std::filesystem::remove(temporary_path(sh->outputs[i], getpid()), ec) ? 1 : 0;
  }
  Result r;
  const bool died = WIFSIGNALED(st);
  if (sh->crashed && (died || WEXITSTATUS(st) != 0)) {
    const bool corrupt = sh->in_hdf5 && !sh->finished;
    r = {corrupt ? Outcome::CorruptHdf5 : Outcome::InternalCrash, corrupt ? 2 : 70, crash_message(tool, *sh, corrupt, n_removed)};
  } else if (died) {
    const int sig = WTERMSIG(st);
    r = {Outcome::Killed, sig, ""};
    if (sig != g_forwarded && sig != SIGPIPE)
      r.message = tool + ": the command was killed by " + signal_name(sig) +
                  (sig == SIGKILL ? " (by the out-of-memory killer?)" : "") + ".";
  } else {
    r = {Outcome::Exited, WEXITSTATUS(st), ""};
  }
  munmap(page, sizeof(Shared));
  return r;
}

int run(const std::string& tool, const std::function<int()>& fn) {
  const Result r = run_child(tool, fn);
  if (!r.message.empty()) std::fprintf(stderr, "%s\n", r.message.c_str());
  if (r.outcome != Outcome::Killed) return r.status;
  std::fflush(nullptr);
  signal(r.status, SIG_DFL);
  raise(r.status);  // die as the child died
  return 128 + r.status;
}

}  // namespace k4::guard
