// golden_edits.hpp -- the structure-aware golden fuzzing: small valid goldens and dumps
// ("bases"), an edit program that changes a copy of one through the HDF5 API, and the
// readers run on the result. Header only: fuzz_golden_reader.cpp and the CPU suite's
// regression tests (tests/cpu/test_fuzz_regressions.cpp) share it.
//
// Bases (make_world, once a process; tiny preset, synthetic weights, seed 1):
//   0 golden tp 1, S 2, whole KV (context 300, cache_blocks 4)
//   1 golden tp 2, S 1, selected KV, static KV scale, kv_page_stride 8 (contexts 2100)
//   2 dump of base 0, every stage
//   3 dump of base 1, rank 1 only, stages split and moe, moe/outputs/gate left out
//   4 inputs file (K4INPUTS, write_inputs_file) of base 0's inputs
//
// Edit program (the fuzz input, read front to back by Bytes; an exhausted input reads 0):
//   byte 0     base (mod 5)
//   byte 1     reader flags (exercise() below): bits 1-2 the deep read, bit 0 replay
//   then ops:  byte op (mod kOps) and its arguments, until the input ends (at most 64 ops):
//     0 delete a link (dataset, group or soft link)      8 set an element of a targeted dataset
//     1 delete an attribute                              9 edit the config JSON attribute
//     2 set an integer attribute                        10 relink: a soft link to another path
//     3 set a string attribute                          11 an external link in its place
//     4 set an attribute of another kind (double,       12 a hard link to another object
//       int array, variable-length string, u8, "")     13 copy an object (H5Ocopy) elsewhere
//     5 replace a dataset by one of another element     14 a group in its place
//       type / rank / shape (data from the input)       15 truncate the file (after closing)
//     6 set elements of any dataset                     16 set an attribute of an existing pair
//     7 write a whole dataset from the input bytes
// Values: an "interesting" table (0, +-1, powers of two and their neighbours, int32 / int64
// limits) or 8 raw bytes.
#pragma once
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "golden/diff/compare.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace k4::fuzz {

struct Link {
  std::string path;
  enum Kind { Group, Dataset, Soft, Other } kind = Other;
};

struct Inventory {
  std::vector<Link> links;                                   // every link below /
  std::vector<std::string> objects;                          // "/" and every hard group / dataset
  std::vector<std::string> datasets;                         // hard datasets
  std::vector<std::pair<std::string, std::string>> attrs;    // (object, attribute name)
};

struct Base {
  std::string name, path;
  bool golden = false;
  bool inputs = false;  // an inputs file (K4INPUTS)
  int tp = 1;
  std::string pristine_golden;  // the golden this file is (or is a dump of)
  std::string pristine_dump;    // a dump of that golden (diff with the edited golden as golden side)
  Inventory inv;
  std::map<std::string, std::vector<uint64_t>> shapes;  // the pristine golden's dataset shapes
};

struct World {
  std::vector<Base> bases;
};

namespace detail {

inline herr_t visit_cb(hid_t g, const char* name, const H5L_info_t* info, void* data) {
  auto* inv = static_cast<Inventory*>(data);
  Link l;
  l.path = std::string("/") + name;
  if (info->type == H5L_TYPE_SOFT) {
    l.kind = Link::Soft;
  } else if (info->type == H5L_TYPE_HARD) {
    H5O_info_t oi;
    if (H5Oget_info_by_name2(g, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) >= 0)
      l.kind = oi.type == H5O_TYPE_GROUP ? Link::Group : oi.type == H5O_TYPE_DATASET ? Link::Dataset : Link::Other;
  }
  inv->links.push_back(l);
  if (l.kind == Link::Group || l.kind == Link::Dataset) inv->objects.push_back(l.path);
  if (l.kind == Link::Dataset) inv->datasets.push_back(l.path);
  return 0;
}

inline herr_t attr_cb(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}

}  // namespace detail

inline Inventory inventory(const std::string& path) {
  h5::silence_errors();
  Inventory inv;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) finding("inventory", "cannot open base " + path);
  inv.objects.push_back("/");
  H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, detail::visit_cb, &inv);
  for (const std::string& o : inv.objects) {
    hid_t h = H5Oopen(f, o.c_str(), H5P_DEFAULT);
    if (h < 0) continue;
    std::vector<std::string> names;
    hsize_t idx = 0;
    H5Aiterate2(h, H5_INDEX_NAME, H5_ITER_INC, &idx, detail::attr_cb, &names);
    for (const std::string& n : names) inv.attrs.push_back({o, n});
    H5Oclose(h);
  }
  H5Fclose(f);
  return inv;
}

// The shape of every dataset (through soft links) of a file, by path.
inline std::map<std::string, std::vector<uint64_t>> shapes_of(const std::string& path, const Inventory& inv) {
  std::map<std::string, std::vector<uint64_t>> out;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  for (const Link& l : inv.links) {
    if (l.kind != Link::Dataset && l.kind != Link::Soft) continue;
    hid_t d = H5Dopen2(f, l.path.c_str(), H5P_DEFAULT);
    if (d < 0) continue;
    hid_t sp = H5Dget_space(d);
    const int rank = H5Sget_simple_extent_ndims(sp);
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
    if (rank > 0) H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
    out[l.path] = std::vector<uint64_t>(dims.begin(), dims.end());
    H5Sclose(sp);
    H5Dclose(d);
  }
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

// The bases, written into dir (which must exist).
inline World make_world(const std::string& dir) {
  World w;
  StepInputs in0;
  auto golden_of = [&](int tp, const Scenario& scn0, const std::string& kv_form, const std::string& name,
                       StepResult& res_out, Config& cfg_out) {
    Config cfg = preset("tiny", tp);
    Scenario scn = scn0;
    apply_scenario(scn, cfg);
    validate_scenario(scn, cfg);
    const LayerWeights lw = synth::synthetic_layer(cfg, 1);
    const StepInputs in = make_inputs(cfg, scn, 1, &lw);
    res_out = run_step(lw, in);
    golden::GoldenMeta meta;
    meta.scenario_json = scenario_to_json(scn);
    meta.weight_seed = meta.input_seed = 1;
    meta.kv_form = kv_form;
    golden::WriteOptions wo;
    wo.overwrite = true;
    const std::string p = dir + "/" + name;
    golden::write_golden(p, lw, in, res_out, meta, wo);
    cfg_out = cfg;
    if (tp == 1) in0 = in;
    return p;
  };
  Scenario s0;
  s0.tokens = 2;
  s0.context = {"300"};
  s0.cache_blocks = 4;
  Scenario s1;
  s1.tokens = 1;
  s1.context = {"2100"};
  s1.cache_blocks = 64;
  s1.static_kv_scale = 1;
  s1.kv_page_stride = 8;
  StepResult r0, r1;
  Config c0, c1;
  const std::string g0 = golden_of(1, s0, "whole", "golden_tp1.h5", r0, c0);
  const std::string g1 = golden_of(2, s1, "selected", "golden_tp2.h5", r1, c1);
  const std::string d0 = dir + "/dump_tp1.h5", d1 = dir + "/dump_tp2.h5";
  golden::write_dump(d0, c0, 2, r0, {}, true);
  golden::DumpSelection sel;
  sel.ranks = {1};
  sel.stages = {"split", "moe"};
  sel.omit = {"moe/outputs/gate"};
  golden::write_dump(d1, c1, 1, r1, sel, true);
  const std::string i0 = dir + "/inputs_tp1.h5";
  golden::write_inputs_file(i0, c0, in0, true);
  w.bases.push_back({"golden_tp1", g0, true, false, 1, g0, d0, {}, {}});
  w.bases.push_back({"golden_tp2", g1, true, false, 2, g1, d1, {}, {}});
  w.bases.push_back({"dump_tp1", d0, false, false, 1, g0, d0, {}, {}});
  w.bases.push_back({"dump_tp2", d1, false, false, 2, g1, d1, {}, {}});
  w.bases.push_back({"inputs_tp1", i0, false, true, 1, g0, d0, {}, {}});
  for (Base& b : w.bases) b.inv = inventory(b.path);
  for (Base& b : w.bases) b.shapes = shapes_of(b.pristine_golden, inventory(b.pristine_golden));
  return w;
}

// ---- the edit program ------------------------------------------------------------------

inline int64_t value(Bytes& b) {
  static const int64_t kTable[] = {0, 1, -1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 127, 128, 129, 255,
                                   256, 257, 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 8192,
                                   65535, 65536, 1 << 20, (1 << 20) + 1, 0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000,
                                   std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
                                   int64_t(1) << 31, (int64_t(1) << 32) - 1, int64_t(1) << 32, int64_t(1) << 40,
                                   int64_t(1) << 62, std::numeric_limits<int64_t>::max(),
                                   std::numeric_limits<int64_t>::min(), -2, -128, -32768, -65536, 0x7F, 0xFF, 0x7E,
                                   0x7FFF, 0xFFFF, 0x7F80, 0xFF80, 0x8000};
  constexpr size_t n = sizeof(kTable) / sizeof(kTable[0]);
  const uint8_t x = b.u8();
  if (x < 224) return kTable[x % n];
  return int64_t(b.u64());
}

inline const std::vector<std::string>& attr_names() {
  static const std::vector<std::string> v = {
      "magic",  "schema_version", "contract_version", "tool_version", "config",    "scenario",    "seeds",
      "weights", "tp",            "tokens",           "kind",         "q_len",     "bt_width",    "score_width",
      "rank",   "kv_form",        "n_pages",          "n_stored_pages", "n_experts", "dtype",     "dims",
      "meaning"};
  return v;
}

inline const std::vector<std::string>& string_values() {
  static const std::vector<std::string> v = {
      "K4GOLDEN", "K4INPUTS", "whole", "selected", "dump", "bf16", "f32", "i32", "u8", "e4m3", "e8m0", "e2m1x2",
      "", "token", "token,dim", "token,split,dim", "page,page_key", "one", "{}", "[]", "{\"inputs_file\": \"x\"}",
      "1", "2", "K4GOLDEN\x01", "k4golden", "selected ", "f64", "x,y,z,w,v"};
  return v;
}

inline const std::vector<std::string>& config_fields() {
  static const std::vector<std::string> v = {
      "name",         "heads",  "head_dim",   "hidden",   "n_routed",  "top_k",      "inter",         "sparse_block",
      "topk_blocks",  "page",   "n_split",    "max_tokens", "max_context", "kv_page_stride", "variant",
      "waves",        "lanes",  "o_rows",     "dn_rows",  "ug_rows",   "sh_rows",    "tp",            "sm_scale",
      "eps",          "route_scale", "shared_weight", "swiglu_limit", "init_blocks", "local_blocks", "wide_from",
      "ag_rs_from"};
  return v;
}

namespace detail {

inline hid_t file_type(int k) {
  switch (k % 11) {
    case 0: return H5T_STD_U8LE;
    case 1: return H5T_STD_I8LE;
    case 2: return H5T_STD_U16LE;
    case 3: return H5T_STD_I16LE;
    case 4: return H5T_STD_I32LE;
    case 5: return H5T_STD_U32LE;
    case 6: return H5T_STD_I64LE;
    case 7: return H5T_STD_U64LE;
    case 8: return H5T_IEEE_F32LE;
    case 9: return H5T_IEEE_F64LE;
    default: return H5T_STD_U16BE;
  }
}

// A string attribute (fixed length, or variable length).
inline void put_string_attr(hid_t obj, const std::string& name, const std::string& v, bool vlen) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t t = H5Tcopy(H5T_C_S1);
  hid_t s = H5Screate(H5S_SCALAR);
  if (vlen) {
    H5Tset_size(t, H5T_VARIABLE);
    hid_t a = H5Acreate2(obj, name.c_str(), t, s, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      const char* p = v.c_str();
      H5Awrite(a, t, &p);
      H5Aclose(a);
    }
  } else {
    H5Tset_size(t, v.empty() ? 1 : v.size());
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    hid_t a = H5Acreate2(obj, name.c_str(), t, s, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      std::string buf = v.empty() ? std::string(1, '\0') : v;
      H5Awrite(a, t, buf.data());
      H5Aclose(a);
    }
  }
  H5Sclose(s);
  H5Tclose(t);
}

inline void put_int_attr(hid_t obj, const std::string& name, int64_t v) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
  }
  H5Sclose(s);
}

inline void put_other_attr(hid_t obj, const std::string& name, Bytes& b) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const int kind = b.u8() % 5;
  if (kind == 3) return put_string_attr(obj, name, b.str(32), true);
  if (kind == 4) return put_string_attr(obj, name, "", false);
  hid_t s;
  hid_t ft, mt;
  int64_t iv[2] = {value(b), value(b)};
  double dv = 0;
  uint8_t u = b.u8();
  if (kind == 0) {
    s = H5Screate(H5S_SCALAR);
    ft = H5T_IEEE_F64LE;
    mt = H5T_NATIVE_DOUBLE;
    const uint64_t bits = b.u64();
    std::memcpy(&dv, &bits, 8);
  } else if (kind == 1) {
    const hsize_t two = 2;
    s = H5Screate_simple(1, &two, nullptr);
    ft = H5T_STD_I64LE;
    mt = H5T_NATIVE_INT64;
  } else {
    s = H5Screate(H5S_SCALAR);
    ft = H5T_STD_U8LE;
    mt = H5T_NATIVE_UINT8;
  }
  hid_t a = H5Acreate2(obj, name.c_str(), ft, s, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    const void* p = kind == 0 ? static_cast<const void*>(&dv) : kind == 1 ? static_cast<const void*>(iv) : &u;
    H5Awrite(a, mt, p);
    H5Aclose(a);
  }
  H5Sclose(s);
}

inline std::string get_string_attr(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) <= 0) return "";
  hid_t a = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
  if (a < 0) return "";
  hid_t t = H5Aget_type(a);
  std::string out;
  if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0) {  // the writer's form
    char* p = nullptr;
    if (H5Aread(a, t, &p) >= 0 && p) out = p;
    if (p) H5free_memory(p);
  } else if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) == 0) {  // fixed length
    out.assign(H5Tget_size(t), '\0');
    if (H5Aread(a, t, out.data()) < 0) out.clear();
    out.resize(std::strlen(out.c_str()));
  }
  H5Tclose(t);
  H5Aclose(a);
  return out;
}

inline void copy_string_attrs(hid_t from, hid_t to) {
  for (const char* n : {"dtype", "dims", "meaning"}) {
    if (H5Aexists(from, n) <= 0) continue;
    put_string_attr(to, n, get_string_attr(from, n), false);
  }
}

// Writes `count` elements from `first` of a dataset of any rank (flat index), each value
// truncated to the element's size (little-endian, the dataset's own type: no conversion).
inline void set_elements(hid_t f, const std::string& path, Bytes& b) {
  hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  if (d < 0) return;
  hid_t t = H5Dget_type(d), s = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(s);
  std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(s, dims.data(), nullptr);
  uint64_t n = 1;
  for (hsize_t x : dims) n *= x;
  const size_t es = H5Tget_size(t);
  const H5T_class_t cls = H5Tget_class(t);
  if (n > 0 && es > 0 && es <= 8 && (cls == H5T_INTEGER || cls == H5T_FLOAT)) {
    const uint8_t mode = b.u8();
    uint64_t first = mode % 4 == 0 ? 0 : mode % 4 == 1 ? n - 1 : mode % 4 == 2 ? n / 2 : b.u32() % n;
    const uint64_t count = std::min<uint64_t>(1 + (mode >> 4) % 4, n - first);
    std::vector<uint8_t> buf(size_t(count) * es);
    for (uint64_t i = 0; i < count; ++i) {
      const int64_t v = value(b);
      std::memcpy(&buf[size_t(i) * es], &v, es);
    }
    // flat -> a hyperslab of the last dimension's consecutive elements (or one at a time)
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t flat = first + i;
      std::vector<hsize_t> start(dims.size()), one(dims.size(), 1);
      for (size_t k = dims.size(); k-- > 0;) {
        start[k] = flat % dims[k];
        flat /= dims[k];
      }
      hid_t fs = H5Dget_space(d);
      if (rank > 0) H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, one.data(), nullptr);
      hid_t ms = H5Screate(H5S_SCALAR);
      H5Dwrite(d, t, ms, fs, H5P_DEFAULT, &buf[size_t(i) * es]);
      H5Sclose(ms);
      H5Sclose(fs);
    }
  }
  H5Sclose(s);
  H5Tclose(t);
  H5Dclose(d);
}

// The whole dataset from the input bytes (repeated), in its own type.
inline void fill_dataset(hid_t f, const std::string& path, Bytes& b) {
  hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  if (d < 0) return;
  hid_t t = H5Dget_type(d), s = H5Dget_space(d);
  const hssize_t n = H5Sget_simple_extent_npoints(s);
  const size_t es = H5Tget_size(t);
  const H5T_class_t cls = H5Tget_class(t);
  if (n > 0 && uint64_t(n) * es <= (uint64_t(1) << 24) && (cls == H5T_INTEGER || cls == H5T_FLOAT)) {
    std::string pat = b.str(64);
    if (pat.empty()) pat.assign(1, char(0xFF));
    std::vector<uint8_t> buf(size_t(n) * es);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(pat[i % pat.size()]);
    H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
  }
  H5Sclose(s);
  H5Tclose(t);
  H5Dclose(d);
}

inline std::vector<hsize_t> dataset_dims(hid_t f, const std::string& path) {
  std::vector<hsize_t> dims;
  hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  if (d < 0) return dims;
  hid_t s = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(s);
  if (rank > 0) {
    dims.resize(size_t(rank));
    H5Sget_simple_extent_dims(s, dims.data(), nullptr);
  }
  H5Sclose(s);
  H5Dclose(d);
  return dims;
}

inline void replace_dataset(hid_t f, const std::string& path, Bytes& b) {
  const std::vector<hsize_t> old = dataset_dims(f, path);
  hid_t od = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  hid_t keep = -1;  // a scratch group holding the old attributes while the dataset is replaced
  const uint8_t attr_mode = b.u8();
  if (od >= 0) {
    keep = H5Gcreate2(f, "/.k4fuzz_attrs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (keep >= 0) copy_string_attrs(od, keep);
    H5Dclose(od);
  }
  const int type = b.u8();
  const int rank = b.u8() % 5;
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  for (int k = 0; k < rank; ++k) {
    const uint8_t m = b.u8() % 4;
    const hsize_t o = size_t(k) < old.size() ? old[size_t(k)] : 1;
    if (m == 0) dims[size_t(k)] = o;
    else if (m == 1) dims[size_t(k)] = (b.u8() & 1) ? o + 1 : (o ? o - 1 : 0);
    else if (m == 2) dims[size_t(k)] = hsize_t(std::min<uint64_t>(uint64_t(std::abs(value(b) % (int64_t(1) << 40))), uint64_t(1) << 40));
    else dims[size_t(k)] = b.u8() % 8;
  }
  H5Ldelete(f, path.c_str(), H5P_DEFAULT);
  hid_t s = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, path.c_str(), file_type(type), s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Sclose(s);
  if (d >= 0) {
    if (keep >= 0 && (attr_mode & 1)) copy_string_attrs(keep, d);
    if (attr_mode & 2) put_string_attr(d, "dtype", b.pick(string_values()), false);
    H5Dclose(d);
    if (attr_mode & 4) fill_dataset(f, path, b);
  }
  if (keep >= 0) {
    H5Gclose(keep);
    H5Ldelete(f, "/.k4fuzz_attrs", H5P_DEFAULT);
  }
}

inline void edit_config(hid_t f, Bytes& b) {
  const std::string text = get_string_attr(f, "config");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) j = nlohmann::json::object();
  const uint8_t mode = b.u8() % 6;
  const std::string field = (b.u8() & 7) ? b.pick(config_fields()) : b.str(12);
  if (mode == 0) {
    j[field] = value(b);
  } else if (mode == 1) {
    static const double kD[] = {0.0, -0.0, 0.5, 1.0, -1.0, 1e-30, 1e30, 3.5e38, 1e300, 2.0, 7.0, 0.088388347648};
    const uint8_t x = b.u8();
    j[field] = kD[x % (sizeof(kD) / sizeof(kD[0]))] * ((x & 0x80) ? 1.0 + 1e-7 : 1.0);
  } else if (mode == 2) {
    switch (b.u8() % 5) {
      case 0: j[field] = b.str(16); break;
      case 1: j[field] = bool(b.u8() & 1); break;
      case 2: j[field] = nullptr; break;
      case 3: j[field] = nlohmann::json::array({value(b)}); break;
      default: j[field] = nlohmann::json::object(); break;
    }
  } else if (mode == 3) {
    j.erase(field);
  } else if (mode == 4) {
    static const char* kPresets[] = {"tiny", "small", "minimax-m3-tp4"};
    const uint8_t x = b.u8();
    j = nlohmann::json::parse(golden::config_to_json(preset(kPresets[x % 3], 1 << ((x >> 2) % 4))));
  } else {
    const std::string text = b.str(200);  // read before the flag: arguments are unsequenced
    const bool flag = (b.u8() & 1) != 0;
    put_string_attr(f, "config", text, flag);
    return;
  }
  put_string_attr(f, "config", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), false);
}

}  // namespace detail

constexpr int kOps = 17;

// Applies the ops of `b` (after the base and flag bytes) to the HDF5 file at `path`, a copy
// of `base`. `log` gets one line an op. Returns the length to truncate the file to, or -1.
inline int64_t apply_edits(const std::string& path, const Base& base, Bytes& b, std::string* log = nullptr) {
  h5::silence_errors();
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) finding("apply_edits", "cannot open the copy of base " + base.name);
  const Inventory& inv = base.inv;
  int64_t truncate_to = -1;
  auto note = [&](const std::string& s) {
    if (log) *log += s + "\n";
  };
  auto any_link = [&]() -> std::string { return inv.links.empty() ? std::string("/inputs") : b.pick(inv.links).path; };
  auto rank_path = [&](const std::string& rel) { return "/rank" + std::to_string(b.u8() % base.tp) + rel; };
  static const std::vector<std::string> kTargets = {
      "/inputs/seq_lens",          "/inputs/block_table",           "/inputs/index_scores",
      "@/split/inputs/page_ids",   "@/moe/inputs/expert_ids",       "@/moe/outputs/route_ids",
      "@/index/outputs/sparse_table", "@/index/outputs/n_ctx",      "@/index/outputs/blocks",
      "@/index/outputs/long_row",  "@/router/outputs/key",          "@/moe/outputs/route_weights",
      "@/split/inputs/k_scale",    "@/moe/inputs/s13",              "@/router/outputs/xsc"};
  for (int op_i = 0; op_i < 64 && !b.empty(); ++op_i) {
    const int op = b.u8() % kOps;
    switch (op) {
      case 0: {
        const std::string p = any_link();
        note("delete link " + p);
        H5Ldelete(f, p.c_str(), H5P_DEFAULT);
        break;
      }
      case 1: {
        if (inv.attrs.empty()) break;
        const auto& [o, n] = b.pick(inv.attrs);
        note("delete attribute " + o + " @" + n);
        H5Adelete_by_name(f, o.c_str(), n.c_str(), H5P_DEFAULT);
        break;
      }
      case 2:
      case 3:
      case 4:
      case 16: {
        std::string o, n;
        if (op == 16 && !inv.attrs.empty()) {
          const auto& pr = b.pick(inv.attrs);
          o = pr.first;
          n = pr.second;
        } else {
          o = b.pick(inv.objects);
          n = (b.u8() & 7) ? b.pick(attr_names()) : b.str(12);
        }
        hid_t h = H5Oopen(f, o.c_str(), H5P_DEFAULT);
        if (h < 0) break;
        const int kind = op == 16 ? b.u8() % 3 : op - 2;
        if (kind == 0) {
          const int64_t v = value(b);
          note("set int attribute " + o + " @" + n + " = " + std::to_string(v));
          detail::put_int_attr(h, n, v);
        } else if (kind == 1) {
          const std::string v = (b.u8() & 3) ? b.pick(string_values()) : b.str(40);
          note("set string attribute " + o + " @" + n + " = '" + v + "'");
          detail::put_string_attr(h, n, v, false);
        } else {
          note("set other-kind attribute " + o + " @" + n);
          detail::put_other_attr(h, n, b);
        }
        H5Oclose(h);
        break;
      }
      case 5: {
        if (inv.datasets.empty()) break;
        const std::string p = b.pick(inv.datasets);
        note("replace dataset " + p);
        detail::replace_dataset(f, p, b);
        break;
      }
      case 6: {
        if (inv.datasets.empty()) break;
        const std::string p = b.pick(inv.datasets);
        note("set elements of " + p);
        detail::set_elements(f, p, b);
        break;
      }
      case 7: {
        if (inv.datasets.empty()) break;
        const std::string p = b.pick(inv.datasets);
        note("fill dataset " + p);
        detail::fill_dataset(f, p, b);
        break;
      }
      case 8: {
        std::string p = b.pick(kTargets);
        if (p[0] == '@') p = rank_path(p.substr(1));
        note("set elements of " + p);
        detail::set_elements(f, p, b);
        break;
      }
      case 9: {
        note("edit config");
        detail::edit_config(f, b);
        break;
      }
      case 10: {
        const std::string p = any_link();
        const uint8_t m = b.u8() % 5;
        const std::string t = m == 0   ? any_link()
                              : m == 1 ? std::string("/nowhere/") + b.str(8)
                              : m == 2 ? p
                              : m == 3 ? p.substr(0, p.rfind('/') == 0 ? 1 : p.rfind('/'))
                                       : b.str(24);
        note("soft link " + p + " -> " + t);
        H5Ldelete(f, p.c_str(), H5P_DEFAULT);
        H5Lcreate_soft(t.c_str(), f, p.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      }
      case 11: {
        const std::string p = any_link();
        const std::string file = (b.u8() & 1) ? base.pristine_golden : std::string("/nonexistent/k4fuzz.h5");
        const std::string t = (b.u8() & 1) ? p : any_link();
        note("external link " + p + " -> " + file + ":" + t);
        H5Ldelete(f, p.c_str(), H5P_DEFAULT);
        H5Lcreate_external(file.c_str(), t.c_str(), f, p.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      }
      case 12: {
        const std::string p = any_link();
        const std::string src = b.pick(inv.objects);
        if (src == p || src == "/") break;
        note("hard link " + p + " -> " + src);
        H5Ldelete(f, p.c_str(), H5P_DEFAULT);
        H5Lcreate_hard(f, src.c_str(), f, p.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      }
      case 13: {
        const std::string src = b.pick(inv.objects);
        if (src == "/") break;
        const uint8_t m = b.u8() % 3;
        const std::string dst = m == 0 ? "/rank" + std::to_string(b.u8() % 9) : m == 1 ? any_link() : src + "_copy";
        if (dst == src || dst.rfind(src + "/", 0) == 0) break;
        note("copy " + src + " -> " + dst);
        H5Ldelete(f, dst.c_str(), H5P_DEFAULT);
        H5Ocopy(f, src.c_str(), f, dst.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      }
      case 14: {
        const std::string p = any_link();
        note("group in place of " + p);
        H5Ldelete(f, p.c_str(), H5P_DEFAULT);
        hid_t g = H5Gcreate2(f, p.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g >= 0) H5Gclose(g);
        break;
      }
      case 15: {
        truncate_to = b.u16();  // a fraction of the file, in 1/65536
        note("truncate to " + std::to_string(truncate_to) + "/65536 of the file");
        break;
      }
    }
    H5Eclear2(H5E_DEFAULT);
  }
  H5Fclose(f);
  if (truncate_to >= 0) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (!ec) {
      const uint64_t len = size * uint64_t(truncate_to) / 65536;
      std::filesystem::resize_file(path, len, ec);
      return int64_t(len);
    }
  }
  return -1;
}

// ---- the readers -----------------------------------------------------------------------

// GoldenReader on `path`: open, then every stage of every rank, every stored expert (and
// one not stored), inputs / result / weights, and validate_inputs on what it read.
inline void read_golden(const std::string& path) {
  golden::GoldenReader gr(path);
  for (const char* a : {"scenario", "seeds", "weights", "tool_version"}) {
    try {
      gr.root_attr(a);
    } catch (const std::invalid_argument&) {
    }
  }
  const Config& cfg = gr.config();
  for (int r = 0; r < gr.tp(); ++r) {
    gr.index(r);
    gr.split(r);
    gr.merge(r);
    gr.oproj(r);
    gr.router(r);
    golden::MoeStage m = gr.moe(r);
    for (int32_t e : m.expert_ids) m.experts->expert(r, e);
    bool threw = false;
    try {
      m.experts->expert(r, -7);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    if (!threw) finding("read_golden", "ExpertSource served expert -7");
    gr.rank_result(r);
  }
  bool threw = false;
  try {
    gr.index(gr.tp());
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  if (!threw) finding("read_golden", "index(tp) did not throw");
  const StepInputs in = gr.inputs();
  gr.result();
  const LayerWeights w = gr.weights();
  validate_inputs(in, cfg);
}

// DumpReader on `path`: root attributes, then every dataset of the schema (ranks 0..tp, tp
// not there) read at the pristine golden's shape (`shapes`), as compare does.
inline void read_dump(const std::string& path, const std::map<std::string, std::vector<uint64_t>>& shapes, int tp) {
  golden::DumpReader d(path, "dump");
  for (const char* a : {"config", "kind", "tool_version"})
    if (d.has_root_attr(a)) d.root_attr_string(a);
  for (const char* a : {"tp", "tokens"})
    if (d.has_root_attr(a)) d.root_attr_int(a);
  for (const golden::TensorSpec& s : golden::tensor_specs()) {
    for (int r = 0; r <= tp; ++r) {
      const std::string p = s.group[0] == '/' ? std::string(s.group) + "/" + s.name
                                              : "/rank" + std::to_string(r) + "/" + s.group + "/" + s.name;
      d.has_group("/rank" + std::to_string(r));
      if (d.has_dataset(p)) {
        d.stores(p);
        golden::RawTensor got;
        std::string why;
        auto it = shapes.find(p);
        // not in the golden: a read must then be of this tiny shape
        d.read(p, s.dtype, it != shapes.end() && !it->second.empty() ? it->second : std::vector<uint64_t>{1}, got, why);
      }
      if (s.group[0] == '/') break;
    }
  }
}

inline void diff_and_report(const std::string& golden_path, const std::string& dump_path, bool replay) {
  golden::DiffOptions opt;
  opt.max_list = 3;
  opt.replay = replay;
  const golden::DiffReport rep = golden::diff_files(golden_path, dump_path, opt);
  golden::report_text(rep, true);
  golden::report_json(rep);
  rep.exit_code(true);
}

// The readers on the edited copy `path` of `base`; a finding aborts. Every input opens the
// file with the readers that validate (GoldenReader for a golden, DumpReader); flags bits
// 1-2 pick one deep read (a golden's data is megabytes: one a run keeps the fuzzer fast):
//   0 GoldenReader: every stage of every rank, and read_inputs_file (a dump: diff_files, as 1)
//   1 diff_files(pristine golden, edited)
//   2 diff_files(edited, pristine dump)            (a dump: DumpReader of every dataset, as 3)
//   3 DumpReader of every schema dataset at the pristine golden's shapes
// and bit 0 turns replay on for the diffs. An inputs file (base 4) gets read_inputs_file and
// validate_inputs on what it holds.
inline void exercise(const Base& base, const std::string& path, uint8_t flags) {
  const unsigned ok = kInvalidArgument | kRuntimeError;
  const bool replay = flags & 1;
  auto inputs = [&] {
    Config c;
    const StepInputs in = golden::read_inputs_file(path, &c);
    validate_inputs(in, c);
  };
  if (base.inputs) {  // an inputs file: what k4 golden --inputs reads; the golden readers refuse it
    expect_clean("read_inputs_file", ok, inputs);
    expect_clean("DumpReader open", ok, [&] { golden::DumpReader d(path, "dump"); });
    return;
  }
  int deep = (flags >> 1) & 3;
  if (!base.golden) deep = deep <= 1 ? 1 : 3;
  if (base.golden && deep != 0) expect_clean("GoldenReader open", ok, [&] { golden::GoldenReader gr(path); });
  expect_clean("DumpReader open", ok, [&] { golden::DumpReader d(path, "dump"); });
  switch (deep) {
    case 0:
      expect_clean("GoldenReader", ok, [&] { read_golden(path); });
      expect_clean("read_inputs_file (a golden's inputs)", ok, inputs);
      break;
    case 1:
      expect_clean("diff_files(pristine golden, edited)", ok, [&] { diff_and_report(base.pristine_golden, path, replay); });
      break;
    case 2:
      expect_clean("diff_files(edited golden, pristine dump)", ok, [&] { diff_and_report(path, base.pristine_dump, replay); });
      break;
    default: expect_clean("DumpReader", ok, [&] { read_dump(path, base.shapes, base.tp); }); break;
  }
}

}  // namespace k4::fuzz
