// bind.hpp -- what the binding files of the Python module k4._k4 share: the objects it hands
// to Python (weights, inputs, steps), the tensor form crossing into numpy, and the lock
// around libhdf5.
//
// No numerics here: every value comes from the C++ libraries (k4_reference, k4_golden); the
// module moves bits between them and numpy arrays of the storage type (uint16 for bf16,
// uint8 for E4M3 / E8M0 / packed E2M1 / u8, uint32 for f32 bits, int32 for i32).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "golden/diff/compare.hpp"
#include "golden/format/schema.hpp"
#include "golden/io/crash_guard.hpp"
#include "golden/inputs/scenario.hpp"
#include "reference/model.hpp"

namespace k4::py {

namespace pyb = pybind11;
using golden::DType;

// libhdf5 is built serial (not thread-safe): every call into it holds this lock. Long calls
// release the GIL first (pyb::gil_scoped_release), then take the lock.
std::mutex& hdf5_lock();
// guard::probe_in_child's verdict as the module's exception: Corrupt -> golden::FormatError
// (k4.FormatError), Crashed -> std::runtime_error (RuntimeError), Ok -> nothing.
void throw_if_crashed(const guard::Probe& p);

// One tensor as it crosses into Python: the schema's dtype and named dims, the stored bits.
struct TensorData {
  DType dtype = DType::U8;
  std::string dims;               // "token,dim"
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;     // row-major, dtype_bytes(dtype) a element
};
// (array of the storage type, dtype name, [dim names]): k4.Tensor is made of it in Python.
pyb::tuple to_python(const TensorData& t);
// The numpy dtype that stores a schema dtype's bits.
pyb::dtype storage_dtype(DType d);
// A numpy array as the bits of `want`: its dtype must be the storage type (a float32 array
// where bf16 is expected is refused, never rounded), C-contiguous. `what` names it in errors.
std::vector<uint8_t> bits_of(const pyb::array& a, DType want, const std::string& what);
DType dtype_named(const std::string& name);  // ValueError listing the names

struct Weights {
  std::shared_ptr<const LayerWeights> w;
  std::string source = "synthetic";  // "synthetic" or "checkpoint PATH"
  uint64_t seed = 0;                 // synthetic weight seed (0 for a checkpoint)
  std::string checkpoint;            // the checkpoint path
  int layer = 0;                     // the checkpoint's layer
  std::string weight_prep;           // a checkpoint's: plan_layer's prep_json (the golden's weight_prep)
};

// k4.Weights.from_tensors (weights.cpp): a layer from per-rank tensors by schema name.
Weights weights_from_tensors(const Config& cfg, const pyb::dict& tensors, const std::string& source, uint64_t seed);

struct Inputs {
  std::shared_ptr<const StepInputs> in;
  Config cfg;                                  // the config after the scenario's overrides
  std::shared_ptr<const LayerWeights> weights; // the weights the inputs were made with (injections applied)
  const LayerWeights* made_from = nullptr;     // the Weights object's layer they derive from
  bool weight_injections = false;
  uint64_t seed = 0;
  std::string scenario_json = "{}";
};

// A step in memory: the model's results with its inputs and weights, by schema path.
struct MemStep {
  std::shared_ptr<const LayerWeights> w;
  std::shared_ptr<const StepInputs> in;
  StepResult res;
  golden::GoldenMeta meta;
  bool weight_injections = false;  // w holds a scenario's weight injections (no weights file then)
  Config cfg() const { return w->cfg; }
  TensorData tensor(const std::string& path) const;
  std::vector<std::string> paths() const;
  // weights_file: as `k4 golden --weights-file` (written when absent, else checked and reused).
  void save(const std::string& path, bool overwrite, const std::string& kv_form, const std::string& weights_file) const;
};

// A golden or dump file, read a tensor at a time.
struct FileStep {
  std::shared_ptr<golden::DumpReader> reader;
  Config cfg;
  int tp = 0, tokens = 0;
  std::string kind;  // "golden" or "dump"
  int q_len = 1;     // /inputs' q_len attribute (1 where the file has none: a dump)
  mutable std::set<std::string> probed;  // tensors read once in a forked child (open_file's guard)
  TensorData tensor(const std::string& path) const;
  std::vector<std::string> paths() const;
  std::string attr(const std::string& name) const;
};
std::shared_ptr<FileStep> open_file(const std::string& path);

// "/inputs/h_in", "rank1/merge/outputs/attn" -> the schema row and the rank (-1 shared).
// ValueError naming the path when the schema has no such tensor.
const golden::TensorSpec& spec_of(const std::string& path, int& rank, std::string& canonical);

// Binding registrations, one a source file.
void bind_tensors(pyb::module_& m);
void bind_config(pyb::module_& m);
void bind_step(pyb::module_& m);
void bind_diff(pyb::module_& m);
void bind_stages(pyb::module_& m);
void bind_policy(pyb::module_& m);
void bind_layout(pyb::module_& m);

}  // namespace k4::py
