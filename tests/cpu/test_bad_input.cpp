// test_bad_input.cpp -- every input path of the `k4` command fed a bad input: missing files,
// directories, unreadable files, damaged safetensors checkpoints, damaged HDF5 goldens / dumps /
// inputs files, inputs the model cannot serve, and bad command-line options. Each case runs
// the real binary and checks the exit code (2: bad input or usage, tools/commands.hpp), that
// k4 ended normally (no abort, no signal), that stderr is one line, holds none of the
// generic texts (std::exception, vector::_M_range_check, an HDF5 error-stack dump), and names
// the file, the tensor / dataset / attribute / option, the index where there is one and what
// was expected. docs/reliability.md ("Bad input") lists the cases with their messages.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "golden/diff/compare.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/inputs/hf_names.hpp"
#include "golden/io/safetensors.hpp"
#include "golden/format/schema.hpp"
#include "reference/numerics/bf16.hpp"
#include "tests/cpu/cli_run.hpp"

namespace fs = std::filesystem;
using namespace k4;
using k4::cli::Run;
using k4::cli::TempDir;

namespace {

// ---- the world: one small golden, its inputs file, a dump of it, a synthetic checkpoint ----

struct World {
  TempDir dir{"bad_input"};
  std::string golden, inputs, dump, ckpt;
  Config cfg;
  int tokens = 4;
  bool ok = false;
};

const World& world() {
  static World W;
  static bool made = false;
  if (made) return W;
  made = true;
  W.golden = W.dir.path("golden.h5");
  W.inputs = W.dir.path("inputs.h5");
  W.dump = W.dir.path("dump.h5");
  W.ckpt = W.dir.path("w.safetensors");
  // tiny, TP 2, S = 4 (q_len 1), whole KV: small files, every check reachable.
  Run r = cli::run(W.dir, "golden --preset tiny --tp 2 --tokens 4 --context 300 --kv-form whole --out " + W.golden);
  if (r.rc != 0) return W;
  r = cli::run(W.dir, "synth --preset tiny --tp 2 --out " + W.ckpt);
  if (r.rc != 0) return W;
  golden::GoldenReader g(W.golden);
  W.cfg = g.config();
  golden::write_inputs_file(W.inputs, W.cfg, g.inputs(), false);
  golden::write_dump(W.dump, W.cfg, g.tokens(), g.result(), {}, false);
  W.ok = true;
  return W;
}

#define NEED_WORLD()                                 \
  REQUIRE_K4();                                         \
  const World& W = world();                          \
  REQUIRE_MESSAGE(W.ok, "the fixture files were not made")

// One scratch directory a case.
struct Case {
  TempDir t{"bad_input_case"};
  std::string path(const std::string& n) const { return t.path(n); }
  std::string copy(const std::string& src, const std::string& name) const {
    const std::string p = path(name);
    fs::copy_file(src, p, fs::copy_options::overwrite_existing);
    return p;
  }
  Run k4(const std::string& args) const { return cli::run(t, args); }
};

// The exit code, a normal exit, one line on stderr naming what `want` lists.
void expect_bad(const Run& r, std::initializer_list<std::string> want, int rc = 2) {
  CAPTURE(r.err);
  CHECK(r.signal == 0);
  CHECK(r.rc == rc);
  for (const std::string& w : want) CHECK_MESSAGE(r.err.find(w) != std::string::npos, "stderr lacks: " << w);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one message
  for (const std::string generic : {"std::exception", "_M_range_check", "vector::", "basic_string", "HDF5-DIAG", "terminate",
                                    "H5Fopen failed", "file signature", "Aborted"})
    CHECK_MESSAGE(r.err.find(generic) == std::string::npos, "generic text in stderr: " << generic);
}

std::string golden_args(const std::string& out) {
  return "golden --preset tiny --tp 2 --tokens 2 --context 300 --out " + out;
}

// ---- HDF5 surgery -----------------------------------------------------------------------

void edit(const std::string& path, const std::function<void(const h5::Group&)>& fn) {
  h5::File f(path, h5::File::Mode::ReadWrite);
  fn(f.root());
  f.close();
}

void delete_attr(const std::string& path, const std::string& obj, const std::string& name) {
  h5::silence_errors();
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  CHECK(H5Adelete_by_name(f, obj.c_str(), name.c_str(), H5P_DEFAULT) >= 0);
  H5Fclose(f);
}

void delete_link(const std::string& path, const std::string& name) {
  h5::silence_errors();
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  CHECK(H5Ldelete(f, name.c_str(), H5P_DEFAULT) >= 0);
  H5Fclose(f);
}

// Replaces dataset `ds` (absolute path) by a new one of `shape` holding zeros of type T, with
// the given dtype attribute.
template <class T>
void replace_dataset(const std::string& path, const std::string& ds, const std::vector<uint64_t>& shape,
                     const std::string& dtype) {
  delete_link(path, ds);
  edit(path, [&](const h5::Group& root) {
    const size_t slash = ds.rfind('/');
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<T> v(n, T(0));
    h5::Dataset d = root.open_group(ds.substr(0, slash)).write<T>(ds.substr(slash + 1), shape, v.data());
    d.set_attr("dtype", dtype);
    d.set_attr("dims", "x");
  });
}

// Reads an int32 dataset, changes it, writes it back.
void poke_i32(const std::string& path, const std::string& ds, const std::function<void(std::vector<int32_t>&)>& fn) {
  edit(path, [&](const h5::Group& root) {
    h5::Dataset d = root.open_dataset(ds);
    std::vector<int32_t> v = d.read<int32_t>();
    fn(v);
    d.write_raw(v.data(), h5::Elem::I32);
  });
}

// ---- safetensors surgery ----------------------------------------------------------------

struct StTensor {
  std::string name;
  st::SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<StTensor> read_checkpoint(const std::string& path) {
  st::File f(path);
  std::vector<StTensor> out;
  for (const std::string& n : f.names()) {
    const st::TensorView& v = f.at(n);
    out.push_back({n, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
  }
  return out;
}

void write_checkpoint(const std::string& path, const std::vector<StTensor>& ts) {
  st::Writer w(path, true);
  for (const StTensor& t : ts) w.declare(t.name, t.dtype, t.shape);
  w.begin();
  for (const StTensor& t : ts) w.write(t.bytes.data(), t.bytes.size());
  w.finish();
}

StTensor& tensor(std::vector<StTensor>& ts, const std::string& name) {
  for (StTensor& t : ts)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  return ts.front();
}

// A raw file: 8-byte little-endian length, header text, data bytes.
void write_raw_st(const std::string& p, const std::string& header, const std::string& data, int64_t len = -1) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  const uint64_t n = len < 0 ? header.size() : uint64_t(len);
  for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
  f << header << data;
}

uint64_t st_header_len(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(f.get())) << (8 * i);
  return n;
}

std::string ckpt_args(const std::string& ck, const std::string& out) {
  return golden_args(out) + " --checkpoint " + ck;
}

}  // namespace

TEST_SUITE("bad_input") {

// ======================================================================== missing files

TEST_CASE("bad input: missing checkpoint") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4(ckpt_args(c.path("none.safetensors"), c.path("x.h5"))),
             {"checkpoint " + c.path("none.safetensors"), "does not exist"});
  CHECK(c.t.entries().empty());
}

TEST_CASE("bad input: missing golden (diff, replay, inspect)") {
  NEED_WORLD();
  Case c;
  const std::string none = c.path("none.h5");
  expect_bad(c.k4("diff " + none + " " + W.dump), {"golden " + none + ": no such file"});
  expect_bad(c.k4("replay " + none + " " + W.dump), {"golden " + none + ": no such file"});
  expect_bad(c.k4("inspect " + none), {"file " + none + ": no such file"});
}

TEST_CASE("bad input: missing dump") {
  NEED_WORLD();
  Case c;
  const std::string none = c.path("none.h5");
  expect_bad(c.k4("diff " + W.golden + " " + none), {"dump " + none + ": no such file"});
}

TEST_CASE("bad input: missing inputs file") {
  NEED_WORLD();
  Case c;
  const std::string none = c.path("none.h5");
  expect_bad(c.k4("golden --inputs " + none + " --out " + c.path("x.h5")), {"inputs file " + none + ": no such file"});
}

TEST_CASE("bad input: missing scenario file") {
  NEED_WORLD();
  Case c;
  const std::string none = c.path("none.json");
  expect_bad(c.k4("golden --preset tiny --scenario " + none + " --out " + c.path("x.h5")),
             {"scenario file " + none + ": no such file"});
}

// ======================================================================== directories

TEST_CASE("bad input: a directory as checkpoint (no *.safetensors in it; a directory named *.safetensors)") {
  NEED_WORLD();
  Case c;
  fs::create_directories(c.path("empty"));
  expect_bad(c.k4(ckpt_args(c.path("empty"), c.path("x.h5"))),
             {"checkpoint " + c.path("empty"), "no *.safetensors file in the directory"});
  fs::create_directories(c.path("d/x.safetensors"));
  expect_bad(c.k4(ckpt_args(c.path("d"), c.path("x.h5"))),
             {"safetensors " + c.path("d/x.safetensors"), "is a directory, expected a .safetensors file"});
}

TEST_CASE("bad input: a directory as golden, dump, inputs file, scenario file") {
  NEED_WORLD();
  Case c;
  const std::string d = c.path("dir");
  fs::create_directories(d);
  expect_bad(c.k4("diff " + d + " " + W.dump), {"golden " + d + ": is a directory, expected a file"});
  expect_bad(c.k4("diff " + W.golden + " " + d), {"dump " + d + ": is a directory, expected a file"});
  expect_bad(c.k4("inspect " + d), {"file " + d + ": is a directory, expected a file"});
  expect_bad(c.k4("golden --inputs " + d + " --out " + c.path("x.h5")), {"inputs file " + d + ": is a directory"});
  expect_bad(c.k4("golden --preset tiny --scenario " + d + " --out " + c.path("x.h5")),
             {"scenario file " + d + ": is a directory"});
}

TEST_CASE("bad input: a directory as --out") {
  NEED_WORLD();
  Case c;
  const std::string d = c.path("dir");
  fs::create_directories(d);
  expect_bad(c.k4(golden_args(d) + " --force"), {"output " + d + " is a directory"});
  expect_bad(c.k4(golden_args(d)), {"output " + d + " is a directory"});
  expect_bad(c.k4(golden_args(c.path("no/such/dir/x.h5"))), {"output directory " + c.path("no/such/dir") + " does not exist"});
}

// ======================================================================== unreadable files

TEST_CASE("bad input: unreadable files (chmod 000)") {
  NEED_WORLD();
  bool can = false;
  const std::string as = cli::unprivileged_prefix(&can);  // as root: k4 runs as nobody (setpriv)
  if (!can) {
    MESSAGE("running as root without setpriv: permissions are not enforced, skipped");
    return;
  }
  Case c;
  auto k4 = [&](const std::string& args) { return cli::run(c.t, args, as); };
  const std::string g = c.copy(W.golden, "g.h5"), d = c.copy(W.dump, "d.h5"), i = c.copy(W.inputs, "i.h5"),
                    k = c.copy(W.ckpt, "w.safetensors"), s = c.path("s.json");
  std::ofstream(s) << "{}";
  for (const std::string& p : {g, d, i, k, s}) fs::permissions(p, fs::perms::none);
  expect_bad(k4("diff " + g + " " + W.dump), {"golden " + g + ": cannot be read (Permission denied)"});
  expect_bad(k4("diff " + W.golden + " " + d), {"dump " + d + ": cannot be read (Permission denied)"});
  expect_bad(k4("inspect " + g), {"file " + g + ": cannot be read (Permission denied)"});
  expect_bad(k4("golden --inputs " + i + " --out " + c.path("x.h5")), {"inputs file " + i + ": cannot be read (Permission denied)"});
  expect_bad(k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k, "cannot open (Permission denied)"});
  expect_bad(k4("golden --preset tiny --scenario " + s + " --out " + c.path("x.h5")),
             {"scenario file " + s + ": cannot be read (Permission denied)"});
  const std::string dir = c.path("ckdir");
  fs::create_directories(dir);
  fs::copy_file(W.ckpt, dir + "/w.safetensors");
  fs::permissions(dir, fs::perms::none);
  expect_bad(k4(ckpt_args(dir, c.path("x.h5"))), {"checkpoint " + dir + ": cannot list the directory (Permission denied)"});
  fs::permissions(dir, fs::perms::owner_all);
  CHECK(!fs::exists(c.path("x.h5")));
}

// ======================================================================== safetensors

TEST_CASE("bad input: safetensors truncated to half (data past the end)") {
  NEED_WORLD();
  Case c;
  const std::string k = c.copy(W.ckpt, "w.safetensors");
  fs::resize_file(k, fs::file_size(k) / 2);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k + ": tensor '", "data_offsets", "run past the end of the file"});
  CHECK(!fs::exists(c.path("x.h5")));
}

TEST_CASE("bad input: safetensors shorter than its 8-byte length") {
  NEED_WORLD();
  Case c;
  const std::string k = c.path("w.safetensors");
  std::ofstream(k, std::ios::binary) << "abc";
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k, "file of 3 bytes is shorter than the 8-byte header length"});
}

TEST_CASE("bad input: safetensors header length past the end of the file") {
  NEED_WORLD();
  Case c;
  const std::string k = c.path("w.safetensors");
  write_raw_st(k, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", std::string(8, '\0'), 4096);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k, "header length 4096 runs past the end of the file"});
}

TEST_CASE("bad input: safetensors header truncated (JSON cut short)") {
  NEED_WORLD();
  Case c;
  const std::string k = c.copy(W.ckpt, "w.safetensors");
  const uint64_t n = st_header_len(k);
  {
    std::fstream f(k, std::ios::binary | std::ios::in | std::ios::out);
    const uint64_t half = n / 2;
    for (int i = 0; i < 8; ++i) f.put(char(half >> (8 * i)));
  }
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k, "header is not valid JSON"});
}

TEST_CASE("bad input: safetensors header corrupt (not JSON)") {
  NEED_WORLD();
  Case c;
  const std::string k = c.copy(W.ckpt, "w.safetensors");
  {
    std::fstream f(k, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8);
    f.put('#');
  }
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k, "header is not valid JSON"});
}

TEST_CASE("bad input: safetensors tensor offsets past the end") {
  NEED_WORLD();
  Case c;
  const std::string k = c.path("w.safetensors");
  write_raw_st(k, R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", std::string(8, '\0'));
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))),
             {"safetensors " + k, "tensor 'a': data_offsets [0,16] run past the end of the file (data section of 8 bytes)"});
}

TEST_CASE("bad input: safetensors shape whose element count overflows") {
  NEED_WORLD();
  Case c;
  const std::string k = c.path("w.safetensors");
  write_raw_st(k, R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,1],"data_offsets":[0,0]}})", "");
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"safetensors " + k, "tensor 'a': shape [4294967296,4294967296,1] has more than 2^60 elements"});
}

TEST_CASE("bad input: checkpoint tensor of the wrong dtype") {
  NEED_WORLD();
  Case c;
  std::vector<StTensor> ts = read_checkpoint(W.ckpt);
  tensor(ts, hf::name(hf::Tensor::Gate, 0)).dtype = st::SafetensorsDtype::I32;  // same bytes (the F32 gate), another dtype
  const std::string k = c.path("w.safetensors");
  write_checkpoint(k, ts);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))),
             {"safetensors " + k, "tensor 'model.layers.0.block_sparse_moe.gate.weight' has dtype I32, expected BF16 or F32"});
}

TEST_CASE("bad input: checkpoint tensor of the wrong shape") {
  NEED_WORLD();
  Case c;
  std::vector<StTensor> ts = read_checkpoint(W.ckpt);
  StTensor& o = tensor(ts, hf::name(hf::Tensor::OProj, 0));
  const std::vector<int64_t> want = o.shape;
  o.shape = {want[0] / 2, want[1] * 2};
  const std::string k = c.path("w.safetensors");
  write_checkpoint(k, ts);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))),
             {"safetensors " + k, "tensor 'model.layers.0.self_attn.o_proj.weight' has shape " + st::shape_str(o.shape) +
                                      ", expected " + st::shape_str(want)});
}

TEST_CASE("bad input: checkpoint tensor missing") {
  NEED_WORLD();
  Case c;
  std::vector<StTensor> ts = read_checkpoint(W.ckpt);
  const std::string gone = hf::name(hf::Tensor::W2Scale, 0, 5);
  ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const StTensor& t) { return t.name == gone; }), ts.end());
  const std::string k = c.path("w.safetensors");
  write_checkpoint(k, ts);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"checkpoint " + k + ": tensor '" + gone + "' is missing"});
}

TEST_CASE("bad input: checkpoint BF16 o_proj with a NaN (quantized on load; was an abort from an OpenMP region)") {
  NEED_WORLD();
  Case c;
  std::vector<StTensor> ts = read_checkpoint(W.ckpt);
  StTensor& o = tensor(ts, hf::name(hf::Tensor::OProj, 0));
  o.dtype = st::SafetensorsDtype::BF16;
  std::vector<uint16_t> v(size_t(o.shape[0] * o.shape[1]), uint16_t(0x3F80));
  v[size_t(5 * o.shape[1] + 17)] = 0x7FC0;  // [5, 17] NaN
  o.bytes.assign(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data()) + v.size() * 2);
  const std::string k = c.path("w.safetensors");
  write_checkpoint(k, ts);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))),
             {"checkpoint " + k + ": tensor 'model.layers.0.self_attn.o_proj.weight' element [5, 17] is NaN",
              "must be finite"});
}

TEST_CASE("bad input: checkpoint BF16 shared expert with an Inf (quantized when first routed)") {
  NEED_WORLD();
  Case c;
  std::vector<StTensor> ts = read_checkpoint(W.ckpt);
  const std::string w1 = hf::name(hf::Tensor::W1, 0, W.cfg.shared_expert(), true);
  StTensor& t = tensor(ts, w1);
  const int64_t R = int64_t(W.cfg.tp) * W.cfg.inter, C = W.cfg.hidden;
  t.dtype = st::SafetensorsDtype::BF16;
  t.shape = {R, C};
  std::vector<uint16_t> v(size_t(R * C), uint16_t(0x3F00));
  v[size_t(3 * C + 40)] = 0x7F80;  // [3, 40] +Inf
  t.bytes.assign(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data()) + v.size() * 2);
  const std::string k = c.path("w.safetensors");
  write_checkpoint(k, ts);
  expect_bad(c.k4(ckpt_args(k, c.path("x.h5"))), {"checkpoint " + k + ": tensor '" + w1 + "' element [3, 40] is Inf"});
}

// ======================================================================== HDF5: not HDF5

TEST_CASE("bad input: not HDF5 (golden, dump, inputs file, inspect)") {
  NEED_WORLD();
  Case c;
  const std::string p = c.path("text.h5");
  std::ofstream(p) << "plain text\n";
  expect_bad(c.k4("diff " + p + " " + W.dump), {"golden " + p + ": cannot be opened as HDF5"});
  expect_bad(c.k4("diff " + W.golden + " " + p), {"dump " + p + ": cannot be opened as HDF5"});
  expect_bad(c.k4("golden --inputs " + p + " --out " + c.path("x.h5")), {"inputs file " + p + " cannot be opened as HDF5"});
  expect_bad(c.k4("inspect " + p), {p + " cannot be opened as HDF5"});
}

// ======================================================================== HDF5: golden

TEST_CASE("bad input: golden missing a dataset") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  delete_link(g, "/rank1/router/outputs/sig");
  expect_bad(c.k4("inspect " + g),
             {"golden " + g + ": dataset /rank1/router/outputs/sig is missing (expected dtype f32, shape (4,32) (token,expert))"});
  expect_bad(c.k4("diff " + g + " " + W.dump), {"golden " + g, "/rank1/router/outputs/sig is missing"});
}

TEST_CASE("bad input: golden missing a root attribute (magic, schema_version, config, tokens, tp)") {
  NEED_WORLD();
  Case c;
  const std::string g0 = c.copy(W.golden, "g0.h5");
  delete_attr(g0, "/", "magic");
  expect_bad(c.k4("diff " + g0 + " " + W.dump), {"golden " + g0 + ": not a K4 golden or dump (no magic attribute at /)"});
  for (const char* a : {"schema_version", "config", "tokens", "tp"}) {
    CAPTURE(a);
    const std::string g = c.copy(W.golden, std::string("g_") + a + ".h5");
    delete_attr(g, "/", a);
    expect_bad(c.k4("inspect " + g), {"golden " + g, std::string("attribute '") + a + "' is missing"});
  }
}

TEST_CASE("bad input: golden group attribute out of range (q_len, bt_width, n_pages)") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  edit(g, [](const h5::Group& r) { r.open_group("/inputs").set_attr("bt_width", int64_t(-3)); });
  expect_bad(c.k4("inspect " + g), {"golden " + g + ": /inputs: attribute bt_width = -3 is outside 1..8192"});
  const std::string g2 = c.copy(W.golden, "g2.h5");
  edit(g2, [](const h5::Group& r) { r.open_group("/inputs").set_attr("q_len", int64_t(3)); });
  expect_bad(c.k4("inspect " + g2), {"golden " + g2 + ": /inputs: attribute q_len = 3 does not divide tokens = 4"});
  const std::string g3 = c.copy(W.golden, "g3.h5");
  edit(g3, [](const h5::Group& r) { r.open_group("/rank1/split/inputs").set_attr("n_pages", int64_t(1) << 40); });
  expect_bad(c.k4("inspect " + g3), {"golden " + g3 + ": /rank1/split/inputs: attribute n_pages = 1099511627776 is outside 1.."});
}

TEST_CASE("bad input: golden dataset of the wrong dtype (attribute, stored type)") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  edit(g, [](const h5::Group& r) { r.open_dataset("/rank0/split/outputs/o").set_attr("dtype", "f32"); });
  expect_bad(c.k4("inspect " + g), {"golden " + g + ": dataset /rank0/split/outputs/o has dtype f32, expected bf16"});
  const std::string g2 = c.copy(W.golden, "g2.h5");
  replace_dataset<int32_t>(g2, "/rank0/merge/outputs/x_scale", {4}, "f32");
  expect_bad(c.k4("diff " + g2 + " " + W.dump),
             {"golden " + g2 + ": dataset /rank0/merge/outputs/x_scale is stored as int32, expected uint32 (raw bits of f32)"});
}

TEST_CASE("bad input: golden dataset of the wrong shape") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  replace_dataset<uint32_t>(g, "/rank1/merge/outputs/x_scale", {3}, "f32");
  expect_bad(c.k4("inspect " + g),
             {"golden " + g + ": dataset /rank1/merge/outputs/x_scale has shape (3), expected dtype f32, shape (4) (token)"});
}

TEST_CASE("bad input: golden of another schema version") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  edit(g, [](const h5::Group& r) { r.set_attr("schema_version", int64_t(3)); });
  expect_bad(c.k4("inspect " + g), {"golden " + g + " was written by schema version 3; this tool reads versions 1..2"});
  expect_bad(c.k4("diff " + g + " " + W.dump), {"golden " + g + ": was written in schema version 3; this tool reads versions 1..2"});
}

TEST_CASE("bad input: golden config JSON broken, invalid, from another preset") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  edit(g, [](const h5::Group& r) { r.set_attr("config", "{\"name\": \"tiny\","); });
  expect_bad(c.k4("inspect " + g), {"golden " + g + ": config is not JSON"});
  const std::string g2 = c.copy(W.golden, "g2.h5");
  Config bad = W.cfg;
  bad.heads = 8;
  edit(g2, [&](const h5::Group& r) { r.set_attr("config", golden::config_to_json(bad)); });
  expect_bad(c.k4("inspect " + g2), {"golden " + g2 + ": config 'tiny': heads must be 16 a rank"});
  const std::string g3 = c.copy(W.golden, "g3.h5");
  edit(g3, [&](const h5::Group& r) { r.set_attr("config", golden::config_to_json(preset("small", 2))); });
  expect_bad(c.k4("inspect " + g3), {"golden " + g3 + ": dataset /inputs/h_in has shape (4,2048), expected dtype bf16, shape (4,4096)"});
}

TEST_CASE("bad input: golden tp attribute that differs from its config") {
  NEED_WORLD();
  Case c;
  const std::string g = c.copy(W.golden, "g.h5");
  edit(g, [](const h5::Group& r) { r.set_attr("tp", int64_t(4)); });
  expect_bad(c.k4("inspect " + g), {"golden " + g + ": attribute tp = 4 but config.tp = 2"});
}

// ======================================================================== HDF5: dump

TEST_CASE("bad input: dump missing a root attribute (magic, schema_version, config, tokens, tp)") {
  NEED_WORLD();
  Case c;
  const std::string d0 = c.copy(W.dump, "d0.h5");
  delete_attr(d0, "/", "magic");
  expect_bad(c.k4("diff " + W.golden + " " + d0), {"dump " + d0 + ": not a K4 golden or dump (no magic attribute at /)"});
  const std::string d1 = c.copy(W.dump, "d1.h5");
  delete_attr(d1, "/", "schema_version");
  expect_bad(c.k4("diff " + W.golden + " " + d1), {"dump " + d1 + ": integer attribute schema_version is missing at /"});
  for (const char* a : {"config", "tokens", "tp"}) {
    CAPTURE(a);
    const std::string d = c.copy(W.dump, std::string("d_") + a + ".h5");
    delete_attr(d, "/", a);
    expect_bad(c.k4("diff " + W.golden + " " + d), {"dump " + d, std::string("attribute '") + a + "' is missing at /"});
  }
}

TEST_CASE("bad input: dump of another schema version") {
  NEED_WORLD();
  Case c;
  const std::string d = c.copy(W.dump, "d.h5");
  edit(d, [](const h5::Group& r) { r.set_attr("schema_version", int64_t(0)); });
  expect_bad(c.k4("replay " + W.golden + " " + d), {"dump " + d + ": was written in schema version 0; this tool reads versions 1..2"});
}

TEST_CASE("bad input: dump config JSON broken or from another preset") {
  NEED_WORLD();
  Case c;
  const std::string d = c.copy(W.dump, "d.h5");
  edit(d, [](const h5::Group& r) { r.set_attr("config", "not json"); });
  expect_bad(c.k4("diff " + W.golden + " " + d), {"dump " + d + ": config is not JSON"});
  const std::string d2 = c.copy(W.dump, "d2.h5");
  edit(d2, [](const h5::Group& r) { r.set_attr("config", golden::config_to_json(preset("small", 2))); });
  expect_bad(c.k4("diff " + W.golden + " " + d2), {"dump " + d2 + ": its config differs from the golden's", "\"name\":\"small\"",
                                                    "(golden " + W.golden + ")"});
}

TEST_CASE("bad input: dump whose tokens or tp differ from the golden's") {
  NEED_WORLD();
  Case c;
  const std::string d = c.copy(W.dump, "d.h5");
  edit(d, [](const h5::Group& r) { r.set_attr("tokens", int64_t(3)); });
  expect_bad(c.k4("diff " + W.golden + " " + d), {"dump " + d + ": tokens = 3, the golden's is 4"});
  const std::string d2 = c.copy(W.dump, "d2.h5");
  edit(d2, [](const h5::Group& r) { r.set_attr("tp", int64_t(4)); });
  expect_bad(c.k4("diff " + W.golden + " " + d2), {"dump " + d2 + ": tp = 4, the golden's is 2"});
}

TEST_CASE("dump tensor of the wrong dtype / shape, or missing: a finding about the kernel (exit 1 / 0), named") {
  // Not exit 2 by design (golden/diff/compare.hpp): a dump may hold any subset of the schema, and a
  // tensor the kernel wrote with another dtype or shape is a mismatch of that tensor.
  NEED_WORLD();
  Case c;
  const std::string d = c.copy(W.dump, "d.h5");
  edit(d, [](const h5::Group& r) { r.open_dataset("/rank1/moe/outputs/mid").set_attr("dtype", "f32"); });
  Run r = c.k4("diff " + W.golden + " " + d);
  CHECK(r.rc == 1);
  CHECK(r.out.find("mid dtype differs") != std::string::npos);
  const std::string d2 = c.copy(W.dump, "d2.h5");
  replace_dataset<uint16_t>(d2, "/rank0/oproj/outputs/a", {4, 7}, "bf16");
  r = c.k4("diff " + W.golden + " " + d2);
  CHECK(r.rc == 1);
  CHECK(r.out.find("a shape differs") != std::string::npos);
  const std::string d3 = c.copy(W.dump, "d3.h5");
  delete_link(d3, "/rank0/split/outputs/m");
  CHECK(c.k4("diff " + W.golden + " " + d3).rc == 0);
  r = c.k4("diff " + W.golden + " " + d3 + " --require-all");
  CHECK(r.rc == 1);
}

TEST_CASE("bad input: a dump that holds no tensor of the golden") {
  NEED_WORLD();
  Case c;
  const std::string d = c.path("d.h5");
  golden::DumpSelection sel;
  sel.ranks = {0};
  sel.stages = {"index"};
  sel.omit = {"index/outputs/sparse_table", "index/outputs/blocks", "index/outputs/n_ctx", "index/outputs/long_row"};
  golden::GoldenReader g(W.golden);
  golden::write_dump(d, W.cfg, g.tokens(), g.result(), sel, false);
  expect_bad(c.k4("diff " + W.golden + " " + d), {"dump " + d + " holds no tensor of the golden schema that could be compared"});
}

// ======================================================================== HDF5: inputs file

TEST_CASE("bad input: inputs file missing a dataset") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  delete_link(i, "/rank1/inputs/k_scale");
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": dataset /rank1/inputs/k_scale is missing (expected dtype f32, shape ("});
}

TEST_CASE("bad input: inputs file missing an attribute (magic, schema_version, config, tokens, tp)") {
  NEED_WORLD();
  Case c;
  const std::string i0 = c.copy(W.inputs, "i0.h5");
  delete_attr(i0, "/", "magic");
  expect_bad(c.k4("golden --inputs " + i0 + " --out " + c.path("x.h5")),
             {"inputs file " + i0 + ": no magic attribute at / (expected K4INPUTS or K4GOLDEN)"});
  for (const char* a : {"schema_version", "config", "tokens", "tp", "q_len"}) {
    CAPTURE(a);
    const std::string i = c.copy(W.inputs, std::string("i_") + a + ".h5");
    delete_attr(i, "/", a);
    expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
               {"inputs file " + i + ": /: ", std::string("attribute '") + a + "' is missing"});
  }
  const std::string i2 = c.copy(W.inputs, "i_pages.h5");
  delete_attr(i2, "/rank0/inputs", "n_pages");
  expect_bad(c.k4("golden --inputs " + i2 + " --out " + c.path("x.h5")),
             {"inputs file " + i2 + ": /rank0/inputs: integer attribute 'n_pages' is missing"});
}

TEST_CASE("bad input: inputs file dataset of the wrong dtype (attribute, stored type)") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  edit(i, [](const h5::Group& r) { r.open_dataset("/inputs/h_in").set_attr("dtype", "f32"); });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": dataset /inputs/h_in has dtype f32, expected bf16"});
  const std::string i2 = c.copy(W.inputs, "i2.h5");
  replace_dataset<uint32_t>(i2, "/inputs/seq_lens", {4}, "i32");
  expect_bad(c.k4("golden --inputs " + i2 + " --out " + c.path("x.h5")),
             {"inputs file " + i2 + ": dataset /inputs/seq_lens is stored as uint32, expected int32 (raw bits of i32)"});
}

TEST_CASE("bad input: inputs file dataset of the wrong shape") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  replace_dataset<uint16_t>(i, "/rank0/inputs/q", {4, 100}, "bf16");
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": dataset /rank0/inputs/q has shape (4,100), expected dtype bf16, shape (4,2048) (token,dim)"});
}

TEST_CASE("bad input: inputs file of another schema version, broken config, another preset, tp differing") {
  NEED_WORLD();
  Case c;
  const std::string out = c.path("x.h5");
  const std::string i = c.copy(W.inputs, "i.h5");
  edit(i, [](const h5::Group& r) { r.set_attr("schema_version", int64_t(7)); });
  expect_bad(c.k4("golden --inputs " + i + " --out " + out), {"inputs file " + i + " was written by schema version 7; this tool reads versions 1..2"});
  const std::string i2 = c.copy(W.inputs, "i2.h5");
  edit(i2, [](const h5::Group& r) { r.set_attr("config", "[1, 2"); });
  expect_bad(c.k4("golden --inputs " + i2 + " --out " + out), {"inputs file " + i2 + ": config is not JSON"});
  expect_bad(c.k4("golden --inputs " + W.inputs + " --preset small --out " + out),
             {"inputs file " + W.inputs + " was captured with config", "not preset small"});
  expect_bad(c.k4("golden --inputs " + W.inputs + " --tp 4 --out " + out), {"--tp 4: inputs file " + W.inputs + " was captured with tp 2"});
  const std::string i3 = c.copy(W.inputs, "i3.h5");
  edit(i3, [](const h5::Group& r) { r.set_attr("tp", int64_t(8)); });
  expect_bad(c.k4("golden --inputs " + i3 + " --out " + out), {"inputs file " + i3 + ": attribute tp = 8 but config.tp = 2"});
  CHECK(!fs::exists(out));
}

TEST_CASE("bad input: inputs file with a config the seed's structure cannot serve") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  Config bad = W.cfg;
  bad.top_k = 6;
  edit(i, [&](const h5::Group& r) { r.set_attr("config", golden::config_to_json(bad)); });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": config 'tiny': top_k must be 4"});
}

// ======================================================================== inputs the model cannot serve

TEST_CASE("bad input: block table page id negative") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  int bt = 0;
  edit(i, [&](const h5::Group& r) { bt = int(r.open_group("/inputs").attr_int("bt_width")); });
  poke_i32(i, "/inputs/block_table", [&](std::vector<int32_t>& v) { v[size_t(1 * bt + 0)] = -1; });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": inputs: block_table[1][0]: entry -1 addresses pages up to", "the rank0/cache has"});
}

TEST_CASE("bad input: block table page id past the cache's pages") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  int bt = 0, pages = 0;
  edit(i, [&](const h5::Group& r) {
    bt = int(r.open_group("/inputs").attr_int("bt_width"));
    pages = int(r.open_group("/rank0/inputs").attr_int("n_pages"));
  });
  poke_i32(i, "/inputs/block_table", [&](std::vector<int32_t>& v) { v[size_t(2 * bt + 1)] = pages; });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": inputs: block_table[2][1]: entry " + std::to_string(pages),
              "the rank0/cache has " + std::to_string(pages)});
}

TEST_CASE("bad input: a sequence length past what the block table holds") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  int bt = 0;
  edit(i, [&](const h5::Group& r) { bt = int(r.open_group("/inputs").attr_int("bt_width")); });
  poke_i32(i, "/inputs/seq_lens", [&](std::vector<int32_t>& v) { v[3] = bt * 128 + 1; });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": inputs: block_table[3]: row needs " + std::to_string(bt + 1) + " blocks, the table is " +
                  std::to_string(bt) + " wide"});
}

TEST_CASE("bad input: a negative seq_len") {
  NEED_WORLD();
  Case c;
  const std::string i = c.copy(W.inputs, "i.h5");
  poke_i32(i, "/inputs/seq_lens", [](std::vector<int32_t>& v) { v[0] = -5; });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": inputs: seq_lens[0]: -5 is outside 0..1048576"});
  Case c2;
  std::ofstream(c2.path("s.json")) << R"({"tokens": 2, "context": [-5]})";
  expect_bad(c2.k4("golden --preset tiny --scenario " + c2.path("s.json") + " --out " + c2.path("x.h5")),
             {"scenario " + c2.path("s.json"), "context '-5' is neither a key count in 0..1048576"}, 2);
}

TEST_CASE("bad input: a context past MAX_CONTEXT") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("golden --preset tiny --tokens 2 --context 2000000 --out " + c.path("x.h5")),
             {"scenario: context '2000000' is neither a key count in 0..1048576 nor one of short, medium, long, max"});
}

TEST_CASE("bad input: token count 0 and 17 (options, scenario file, inputs file)") {
  NEED_WORLD();
  Case c;
  const std::string out = c.path("x.h5");
  expect_bad(c.k4("golden --preset tiny --tokens 0 --out " + out), {"scenario: tokens 0 is outside 1..16"});
  expect_bad(c.k4("golden --preset tiny --tokens 17 --out " + out), {"scenario: tokens 17 is outside 1..16"});
  std::ofstream(c.path("s.json")) << R"({"tokens": 17})";
  expect_bad(c.k4("golden --preset tiny --scenario " + c.path("s.json") + " --out " + out), {"scenario " + c.path("s.json") + ": tokens 17 is outside 1..16"});
  for (int bad : {0, 17}) {
    const std::string i = c.copy(W.inputs, "i" + std::to_string(bad) + ".h5");
    edit(i, [&](const h5::Group& r) { r.set_attr("tokens", int64_t(bad)); });
    expect_bad(c.k4("golden --inputs " + i + " --out " + out),
               {"inputs file " + i + ": /: attribute tokens = " + std::to_string(bad) + " is outside 1..16"});
  }
  CHECK(!fs::exists(out));
}

TEST_CASE("bad input: q_len that does not divide the token count (options, inputs file)") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("golden --preset tiny --tokens 4 --q-len 3 --out " + c.path("x.h5")), {"scenario: q_len 3 must divide tokens 4"});
  expect_bad(c.k4("golden --preset tiny --tokens 4 --q-len 0 --out " + c.path("x.h5")), {"scenario: q_len 0 must divide tokens 4"});
  const std::string i = c.copy(W.inputs, "i.h5");
  edit(i, [](const h5::Group& r) { r.set_attr("q_len", int64_t(3)); });
  expect_bad(c.k4("golden --inputs " + i + " --out " + c.path("x.h5")),
             {"inputs file " + i + ": inputs: q_len: 3 must divide the token count 4"});
}

TEST_CASE("bad input: a request's rows that are not consecutive positions (short row past THREADS blocks)") {
  NEED_WORLD();
  Case c;
  // rows 0, 1 of a 2-row request: row 0 long (past 512 blocks), row 1 (the last) short
  const std::string i = c.copy(W.inputs, "i.h5");
  golden::GoldenReader g(W.golden);
  StepInputs in = g.inputs();
  in.shared.q_len = 2;
  in.shared.bt_width = in.shared.score_width = 600;
  in.shared.seq_lens = {600 * 128, 100, 100, 100};
  in.shared.block_table.assign(size_t(4) * 600, 0);
  for (StepRank& R : in.ranks) R.index_scores.assign(size_t(4) * 600, 0.0f);
  const std::string p = c.path("i2.h5");
  golden::write_inputs_file(p, W.cfg, in, false);
  expect_bad(c.k4("golden --inputs " + p + " --out " + c.path("x.h5")),
             {"inputs file " + p + ": inputs: seq_lens[0]: a short request's row has 600 blocks (> THREADS = 512)"});
}

TEST_CASE("bad input: configs the seed's structure cannot serve, through options (tp 3, kv_page_stride 12)") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("golden --preset tiny --tp 3 --out " + c.path("x.h5")), {"config 'tiny': tp must be 1, 2, 4 or 8"});
  expect_bad(c.k4("golden --preset tiny --tp 0 --out " + c.path("x.h5")), {"config 'tiny': tp must be 1, 2, 4 or 8"});
  expect_bad(c.k4("synth --preset tiny --tp 3 --out " + c.path("w.safetensors")), {"config 'tiny': tp must be 1, 2, 4 or 8"});
  expect_bad(c.k4("golden --preset tiny --kv-page-stride 12 --out " + c.path("x.h5")), {"scenario: kv_page_stride 12 is none of 8, 16"});
  CHECK(c.t.entries().empty());
}

TEST_CASE("bad input: scenario file keys: unknown, wrong type, out of range") {
  NEED_WORLD();
  Case c;
  const std::string s = c.path("s.json"), out = c.path("x.h5");
  auto with = [&](const std::string& json) {
    std::ofstream(s, std::ios::trunc) << json;
    return c.k4("golden --preset tiny --scenario " + s + " --out " + out);
  };
  expect_bad(with(R"({"tokenz": 3})"), {"scenario " + s + ": unknown key 'tokenz'"});
  expect_bad(with(R"({"inject": {"nan": 1}})"), {"scenario " + s + ": unknown inject key 'nan'"});
  expect_bad(with(R"({"tokens": 2.5})"), {"scenario " + s + ": key 'tokens' is 2.5, expected an integer"});
  expect_bad(with(R"({"tokens": 4294967298})"), {"scenario " + s + ": key 'tokens' is 4294967298, outside the int range"});
  expect_bad(with(R"({"pad_rows": [1, "x"]})"), {"scenario " + s + ": key 'pad_rows[1]' is \"x\", expected an integer"});
  expect_bad(with(R"({"tokens": 2, "pad_rows": [5]})"), {"scenario " + s + ": pad row 5 is outside 0..1"});
  expect_bad(with(R"({"tokens": 2, "inject": {"zero_rows": [-1]}})"), {"scenario " + s + ": zero row -1 is outside 0..1"});
  expect_bad(with(R"({"inject": {"repeated_expert": 99}})"), {"scenario " + s + ": repeated_expert 99 is outside 0..31"});
  expect_bad(with(R"({"cache_blocks": 100000})"), {"scenario " + s + ": cache_blocks 100000 is outside 1..16384"});
  expect_bad(with(R"({"inject": {"extreme_q": 1}})"), {"scenario " + s + ": key 'extreme_q' has the wrong type"});
  expect_bad(with("{"), {"scenario " + s + ": not valid JSON"});
  expect_bad(with(R"({"inject": {"nan_weight": "bias"}})"), {"scenario " + s + ": nan_weight 'bias' is none of w_o, s_o, g_post, w_gate"});
  expect_bad(with(R"({"tokens": 2, "static_kv_scale": true, "inject": {"zero_attn_rows": [0]}})"),
             {"scenario " + s + ": zero_attn_rows needs per-key KV scales (not static_kv_scale)"});
  expect_bad(with(R"({"tokens": 2, "inject": {"zero_attn_rows": [2]}})"), {"scenario " + s + ": zero_attn_row 2 is outside 0..1"});
  CHECK(!fs::exists(out));
}

// ======================================================================== command-line options

TEST_CASE("bad input: unknown option, unknown subcommand, missing required option") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("golden --preset tiny --frob --out " + c.path("x.h5")), {"The following argument was not expected: --frob"});
  expect_bad(c.k4("frobnicate"), {"k4: unknown subcommand 'frobnicate' (known: synth, golden, inspect, diff, replay, checkpoint; see k4 --help)"});
  expect_bad(c.k4("golden --preset tiny"), {"--out is required"});
  expect_bad(c.k4("diff " + W.golden), {"DUMP is required"});
}

TEST_CASE("bad input: bad numbers (--tokens abc, --seed -1, --max x)") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("golden --preset tiny --tokens abc --out " + c.path("x.h5")), {"--tokens", "abc"});
  expect_bad(c.k4("golden --preset tiny --seed -1 --out " + c.path("x.h5")), {"--seed: '-1' is not a non-negative integer"});
  expect_bad(c.k4("golden --preset tiny --pad-rows 1,x --out " + c.path("x.h5")), {"--pad-rows: 'x' is not an integer"});
  expect_bad(c.k4("golden --preset tiny --repeated-expert , --out " + c.path("x.h5")), {"--repeated-expert: ',' is not one integer"});
  expect_bad(c.k4("diff " + W.golden + " " + W.dump + " --max x"), {"--max", "x"});
  CHECK(c.t.entries().empty());
}

TEST_CASE("bad input: out-of-range values (--tokens 17, --tp 3, --threads 0, --layer -1, --nan-scores -5, --cache-blocks 0)") {
  NEED_WORLD();
  Case c;
  const std::string out = " --out " + c.path("x.h5");
  expect_bad(c.k4("golden --preset tiny --tokens 17" + out), {"tokens 17 is outside 1..16"});
  expect_bad(c.k4("golden --preset tiny --tp 3" + out), {"tp must be 1, 2, 4 or 8"});
  expect_bad(c.k4("golden --preset tiny --threads 0" + out), {"--threads: Value 0 not in range 1 to 1024"});
  expect_bad(c.k4("golden --preset tiny --layer -1" + out), {"--layer: Value -1 not in range"});
  expect_bad(c.k4("golden --preset tiny --nan-scores -5" + out), {"inject nan_scores -5 is outside 0..1000000"});
  expect_bad(c.k4("golden --preset tiny --cache-blocks 0" + out), {"cache_blocks 0 is outside 1..16384"});
  expect_bad(c.k4("golden --preset tiny --kv-form half" + out), {"--kv-form", "half"});
  expect_bad(c.k4("inspect " + W.golden + " --samples -1"), {"--samples: Value -1 not in range"});
  CHECK(c.t.entries().empty());
}

TEST_CASE("bad input: unknown preset (golden, synth)") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("golden --preset huge --out " + c.path("x.h5")), {"unknown preset 'huge' (known: minimax-m3-tp4, small, tiny)"});
  expect_bad(c.k4("synth --preset huge --out " + c.path("w.safetensors")), {"unknown preset 'huge'"});
  expect_bad(c.k4("golden --out " + c.path("x.h5")), {"--preset is required (or --inputs, or --checkpoint DIR with config.json)"});
}

TEST_CASE("bad input: options that exclude each other (--inputs with a scenario)") {
  NEED_WORLD();
  Case c;
  std::ofstream(c.path("s.json")) << "{}";
  expect_bad(c.k4("golden --inputs " + W.inputs + " --scenario " + c.path("s.json") + " --out " + c.path("x.h5")),
             {"--inputs excludes --scenario"});
  expect_bad(c.k4("golden --inputs " + W.inputs + " --q-len 2 --out " + c.path("x.h5")),
             {"--inputs excludes the scenario options (--q-len given)"});
}

TEST_CASE("bad input: inspect --path that is not in the file") {
  NEED_WORLD();
  Case c;
  expect_bad(c.k4("inspect " + W.golden + " --path /rank9"), {"--path /rank9: no such group or dataset in " + W.golden});
}

TEST_CASE("inspect validates inputs files and dumps by their own readers") {
  NEED_WORLD();
  Case c;
  CHECK(c.k4("inspect " + W.inputs + " --no-stats").rc == 0);
  CHECK(c.k4("inspect " + W.dump + " --no-stats").rc == 0);
  const std::string i = c.copy(W.inputs, "i.h5");
  poke_i32(i, "/inputs/seq_lens", [](std::vector<int32_t>& v) { v[1] = -1; });
  expect_bad(c.k4("inspect " + i), {"inputs file " + i + ": inputs: seq_lens[1]: -1 is outside 0..1048576"});
  CHECK(c.k4("inspect " + i + " --no-validate --no-stats").rc == 0);
}

}  // TEST_SUITE bad_input
