// crash_guard.cpp -- see crash_guard.hpp.
#include "golden/io/crash_guard.hpp"

#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
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

#include "golden/io/hdf5.hpp"

// Present only in a sanitizer build (ASan, UBSan, TSan): called when a report ends the process.
extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

namespace k4::guard {
namespace {

constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP};
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
constexpr int kMaxTemps = 16;

// What a handler needs, written before it can run (no allocation in a handler).
char g_tool[128];                      // "k4 diff"
char g_version[32];                    // libhdf5's
char g_hdf5_file[2048];                // the file of the last libhdf5 call
char g_temps[kMaxTemps][1024];         // the temporaries being written
volatile sig_atomic_t g_temp_used[kMaxTemps];
volatile sig_atomic_t g_active = 0;    // run() installed the handlers
volatile sig_atomic_t g_finished = 0;  // the command had returned (a report at exit: leaks)
struct Range { uintptr_t lo, hi; };
constexpr int kMaxRanges = 1 << 14;
Range g_ranges[kMaxRanges];            // libhdf5's code, sorted by lo once prepare() ran
int g_nranges = -1;                    // -1: not looked up yet
void (*g_on_hdf5)(int) = nullptr;      // install_in_process
struct sigaction g_old[NSIG];
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

// Async-signal-safe once prepare() ran: the faulting instruction, then every frame (a fault
// in libc's memcpy called by libhdf5 is libhdf5's).
bool stack_in_hdf5(void* uc) {
  if (in_libhdf5(reinterpret_cast<const void*>(fault_pc(uc)))) return true;
  void* frames[128];
  const int n = backtrace(frames, 128);
  for (int i = 0; i < n; ++i)
    if (in_libhdf5(frames[i])) return true;
  return false;
}

int remove_temporaries() {  // async-signal-safe: unlink(2)
  int removed = 0;
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_temp_used[i] && unlink(g_temps[i]) == 0) ++removed;
  return removed;
}

// A message assembled in a fixed buffer and written with one write(2).
struct Message {
  char buf[4096];
  size_t n = 0;
  Message& operator<<(const char* s) {
    const size_t k = s ? std::min(std::strlen(s), sizeof buf - 2 - n) : 0;
    std::memcpy(buf + n, s, k);
    n += k;
    return *this;
  }
  Message& signal(int sig) {  // "SIGSEGV, Segmentation fault": glibc's tables, no strsignal
    return sig ? *this << "SIG" << sigabbrev_np(sig) << ", " << sigdescr_np(sig) : *this << "a sanitizer report";
  }
  void write_out() {
    buf[n++] = '\n';
    const ssize_t rc = ::write(STDERR_FILENO, buf, n);
    (void)rc;
  }
};

// "libhdf5 1.10.8 crashed (SIGSEGV, ...) on HDF5 file 'F': the file is corrupt (...)."
Message& corrupt_file(Message& m, int sig, const char* file) {
  m << "libhdf5 " << g_version << " crashed (";
  m.signal(sig) << ") on ";
  if (file[0]) m << "HDF5 file '" << file << "'";
  else m << "an HDF5 file";
  return m << ": the file is corrupt (libhdf5 crashes on some damaged files before it can report an error).";
}

// The end of a crashed command: the message, its temporaries removed, exit 2 or 70.
[[noreturn]] void end_crashed(int sig, void* uc) {
  const bool corrupt = !g_finished && stack_in_hdf5(uc);
  const bool removed = remove_temporaries() > 0;
  Message m;
  if (corrupt) {
    m << g_tool << ": error: ";
    corrupt_file(m, sig, g_hdf5_file);
  } else if (g_finished) {
    m << g_tool << ": internal error: ";
    m.signal(sig) << " after the command had finished (a sanitizer report at exit, such as leaks): a bug in k4, "
                  << "not in your files.";
  } else {
    m << g_tool << ": internal error: k4 crashed (";
    m.signal(sig) << ") outside libhdf5: a bug in k4, not in your files; please report it with the command line "
                  << "(K4_NO_GUARD=1 runs it without the crash handlers, for a core dump).";
  }
  if (removed) m << " Its unfinished outputs were removed.";
  m.write_out();
  _exit(corrupt ? 2 : 70);
}

void crash_handler(int sig, siginfo_t*, void* uc) { end_crashed(sig, uc); }

void death_callback() { end_crashed(0, nullptr); }  // a sanitizer report is ending the process

// The temporaries removed, the signal's own action: k4 dies of it once the handler returns.
void stop_handler(int sig) {
  remove_temporaries();
  signal(sig, SIG_DFL);
  raise(sig);
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

void install_crash_handlers(void (*handler)(int, siginfo_t*, void*), int flags) {
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

void install_stop_handlers() {
  for (int sig : kStopSignals) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;  // nohup's, a pipe's writer's
    struct sigaction sa {};
    sa.sa_handler = stop_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

void copy_into(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(s.size(), cap - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = 0;
}

bool guard_off() {
  const char* e = std::getenv("K4_NO_GUARD");
  return e && *e && std::strcmp(e, "0") != 0;
}

// K4_GUARD_SELFTEST=libhdf5 | k4: a crash inside libhdf5 (a bad pointer handed to
// H5Sget_simple_extent_dims, which writes through it) or in our code, before the command:
// the check that this binary's guard classifies both (the static device build included).
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

}  // namespace

bool in_libhdf5(const void* pc) {
  if (g_nranges < 0) prepare();  // not from a handler: prepare() ran before any was installed
  const uintptr_t p = reinterpret_cast<uintptr_t>(pc);  // in the last range starting at or below p?
  const Range* r = std::upper_bound(g_ranges, g_ranges + g_nranges, p, [](uintptr_t v, const Range& x) { return v < x.lo; });
  return r != g_ranges && p < r[-1].hi;
}

void note_hdf5_file(const std::string& file) {
  if (g_active) copy_into(g_hdf5_file, sizeof g_hdf5_file, file);
}

void note_temporary(const std::string& temp) {
  if (temp.size() >= sizeof g_temps[0]) return;
  for (int i = 0; i < kMaxTemps; ++i) {
    if (g_temp_used[i]) continue;
    copy_into(g_temps[i], sizeof g_temps[i], temp);
    g_temp_used[i] = 1;  // after the name: a handler never reads half of one
    return;
  }
}

void forget_temporary(const std::string& temp) {
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_temp_used[i] && temp == g_temps[i]) g_temp_used[i] = 0;
}

void install_in_process(void (*on_hdf5)(int)) {
  prepare();
  g_on_hdf5 = on_hdf5;
  install_crash_handlers(in_process_handler, 0);
}

namespace {
constexpr int kProbeHdf5Exit = 64;  // the child's status: 64 + the signal libhdf5 crashed with
char* g_probe_file = nullptr;       // shared with the parent: the file of the child's last libhdf5 call
void probe_on_hdf5(int sig) {
  if (g_probe_file) std::memcpy(g_probe_file, g_hdf5_file, sizeof g_hdf5_file);
  _exit(kProbeHdf5Exit + sig);
}
}  // namespace

Probe probe_in_child(const std::string& file, const std::function<void()>& fn) {
  if (guard_off()) return {};
  prepare();  // in the parent: the child inherits the ranges, no dl_iterate_phdr after fork
  if (!g_version[0]) copy_into(g_version, sizeof g_version, h5::library_version());
  std::fflush(nullptr);  // nothing buffered is written twice
  void* shared = mmap(nullptr, sizeof g_hdf5_file, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return {};
  g_probe_file = static_cast<char*>(shared);
  g_probe_file[0] = 0;
  const pid_t pid = fork();
  if (pid < 0) {  // no child: read unguarded, as before
    munmap(shared, sizeof g_hdf5_file);
    return {};
  }
  if (pid == 0) {
    g_on_hdf5 = probe_on_hdf5;
    g_hdf5_file[0] = 0;
    g_active = 1;  // the HDF5 layer notes each file it calls libhdf5 on (note_hdf5_file)
    install_crash_handlers(in_process_handler, 0);
    try {
      self_test();
      fn();
    } catch (...) {
    }
    _exit(0);  // no atexit handlers, no stdio flush: the parent's state stays the parent's
  }
  int st = 0;
  pid_t w;
  while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
  }
  char name[sizeof g_hdf5_file];
  std::memcpy(name, g_probe_file, sizeof name);
  name[sizeof name - 1] = 0;
  munmap(shared, sizeof g_hdf5_file);
  g_probe_file = nullptr;
  if (w < 0) return {};
  if (!name[0]) copy_into(name, sizeof name, file);  // no libhdf5 call noted: the file probed
  Message m;
  Probe p;
  if (WIFEXITED(st) && WEXITSTATUS(st) > kProbeHdf5Exit) {
    corrupt_file(m, WEXITSTATUS(st) - kProbeHdf5Exit, name);
    p.kind = Probe::Kind::Corrupt;
  } else if (WIFSIGNALED(st)) {
    p.kind = Probe::Kind::Crashed;
    m << "k4 crashed (";
    m.signal(WTERMSIG(st)) << ") outside libhdf5 reading HDF5 file '" << name
                           << "': a bug in k4, not in your file; please report it (K4_NO_GUARD=1 reads it without the guard).";
  } else {
    return {};
  }
  p.message.assign(m.buf, m.n);
  return p;
}

int run(const std::string& tool, const std::function<int()>& fn) {
  if (guard_off()) return fn();
  prepare();
  copy_into(g_tool, sizeof g_tool, tool);
  copy_into(g_version, sizeof g_version, h5::library_version());
  install_crash_handlers(crash_handler, SA_RESETHAND);  // a fault in the handler dies of it
  install_stop_handlers();
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(death_callback);
  g_active = 1;
  int rc = 1;
  try {
    self_test();
    rc = fn();
  } catch (...) {  // fn is main's body and catches what it expects; this is the last resort
    std::fprintf(stderr, "%s: internal error: an exception escaped the command\n", g_tool);
    rc = 70;
  }
  g_finished = 1;
  return rc;
}

}  // namespace k4::guard
