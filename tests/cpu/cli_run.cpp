// cli_run.cpp -- see cli_run.hpp.
#include "tests/cpu/cli_run.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>

extern char** environ;

namespace fs = std::filesystem;

namespace k4::cli {
namespace {

const char* kOut = ".k4_stdout.txt";
const char* kErr = ".k4_stderr.txt";

Run status_of(int s, const TempDir& t) {
  Run r{-1, 0, slurp(t.path(kOut)), slurp(t.path(kErr))};
  if (WIFEXITED(s)) r.rc = WEXITSTATUS(s);
  if (WIFSIGNALED(s)) r.signal = WTERMSIG(s);
  return r;
}

}  // namespace

std::string k4_bin() {
  if (const char* e = std::getenv("K4_BIN")) return e;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const fs::path p = self.parent_path() / "k4";
  return fs::exists(p) ? p.string() : "";
}

fs::path source_root() { return fs::weakly_canonical(fs::absolute(__FILE__)).parent_path().parent_path().parent_path(); }

TempDir::TempDir(const std::string& tag) {
  static int n = 0;
  dir = fs::temp_directory_path() / ("k4_test_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::remove_all(dir);
  fs::create_directories(dir);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(dir, ec);
}

std::vector<std::string> TempDir::entries() const {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n != kOut && n != kErr) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string unprivileged_prefix(bool* available) {
  *available = true;
  if (::geteuid() != 0) return "";
  if (std::system("command -v setpriv > /dev/null 2>&1") != 0) {
    *available = false;
    return "";
  }
  return "setpriv --reuid=65534 --regid=65534 --clear-groups ";
}

Run run(const TempDir& t, const std::string& args, const std::string& prefix) {
  const int s =
      std::system((prefix + k4_bin() + " " + args + " > " + t.path(kOut) + " 2> " + t.path(kErr)).c_str());
  // system() runs sh -c: a k4 killed by a signal shows as sh's exit status 128 + signal
  Run r = status_of(s, t);
  if (r.rc > 128 && r.rc < 128 + 65) {
    r.signal = r.rc - 128;
    r.rc = -1;
  }
  return r;
}

pid_t spawn(const TempDir& t, const std::vector<std::string>& argv) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, t.path(kOut).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, t.path(kErr).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const std::string bin = k4_bin();
  std::vector<std::string> args = argv;
  args.insert(args.begin(), bin);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, bin.c_str(), &fa, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + bin + " failed");
  return pid;
}

Run wait(const TempDir& t, pid_t pid) {
  int s = 0;
  if (::waitpid(pid, &s, 0) != pid) throw std::runtime_error("waitpid failed");
  return status_of(s, t);
}

}  // namespace k4::cli
