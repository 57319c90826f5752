// file_check.cpp -- see file_check.hpp.
#include "golden/io/file_check.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace k4 {

void require_input_file(const std::string& path, const std::string& what) {
  auto bad = [&](const std::string& m) { throw std::invalid_argument(what + " " + path + ": " + m); };
  if (path.empty()) throw std::invalid_argument(what + ": the path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) bad("no such file");
    bad(std::string("cannot be read (") + std::strerror(errno) + ")");
  }
  if (S_ISDIR(st.st_mode)) bad("is a directory, expected a file");
  if (!S_ISREG(st.st_mode)) bad("is not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad(std::string("cannot be read (") + std::strerror(errno) + ")");
  ::close(fd);
}

std::string read_input_text(const std::string& path, const std::string& what) {
  require_input_file(path, what);
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f && !f.eof()) throw std::invalid_argument(what + " " + path + ": read failed");
  return ss.str();
}

}  // namespace k4
