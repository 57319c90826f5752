// module.cpp -- the extension k4._k4 (the Python package k4 wraps it: python/k4/).
//
// Errors: the C++ libraries' exceptions become Python exceptions with the CLI's one-line
// message: golden::FormatError -> k4.FormatError (a ValueError: an unusable file),
// std::invalid_argument -> ValueError (bad input), h5::Error -> k4.HDF5Error (an OSError),
// anything else -> RuntimeError. Nothing aborts the interpreter.
#include "golden/io/hdf5.hpp"
#include "python/src/bind.hpp"

PYBIND11_MODULE(_k4, m) {
  namespace py = k4::py;
  m.doc() = "k4._k4: bindings of the K4 reference model's C++ libraries (use the package k4)";
  pybind11::register_exception<k4::h5::Error>(m, "HDF5Error", PyExc_OSError);
  pybind11::register_exception<k4::golden::FormatError>(m, "FormatError", PyExc_ValueError);
  py::bind_tensors(m);
  py::bind_config(m);
  py::bind_step(m);
  py::bind_diff(m);
  py::bind_stages(m);
  py::bind_policy(m);
  py::bind_layout(m);
}
