// file_check.hpp -- the checks every reader makes before it opens an input file, so that a
// missing file, a directory or an unreadable file gets one message that says which, instead
// of a library's error stack (HDF5's "unable to locate file signature", mmap's ENODEV).
#pragma once
#include <string>

namespace k4 {

// Throws std::invalid_argument (bad input, exit code 2):
//   "<what> PATH: no such file"
//   "<what> PATH: is a directory, expected a file"
//   "<what> PATH: is not a regular file"            (a FIFO, a device, ...)
//   "<what> PATH: cannot be read (Permission denied)"
// `what` names the role: "golden", "dump", "inputs file", "scenario file", "safetensors".
void require_input_file(const std::string& path, const std::string& what);

// The whole file as text, after require_input_file (a scenario file, a config.json);
// a read that fails midway throws "<what> PATH: read failed".
std::string read_input_text(const std::string& path, const std::string& what);

}  // namespace k4
