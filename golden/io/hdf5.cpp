// hdf5.cpp -- see hdf5.hpp.
#include "golden/io/hdf5.hpp"

#include <cstring>
#include <mutex>

namespace k4::h5 {

std::recursive_mutex& serial_mutex() {
  static std::recursive_mutex m;
  return m;
}

namespace {

// Held by every public function of this file that calls libhdf5 (and by Handle::reset).
using Serial = std::lock_guard<std::recursive_mutex>;

herr_t walk_cb(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n >= 4) return 0;  // the first few frames say what went wrong; the rest is plumbing
  if (!out->empty()) out->append("; ");
  out->append(e->func_name ? e->func_name : "?");
  out->append(": ");
  out->append(e->desc ? e->desc : "");
  return 0;
}

[[noreturn]] void fail(const char* fn, const Where& w, const char* kind) {
  std::string stack = error_stack();
  std::string msg = w.str(kind) + ": " + fn + " failed";
  if (!stack.empty()) msg += " (HDF5: " + stack + ")";
  throw Error(msg);
}

template <class R>
R check(R r, const char* fn, const Where& w, const char* kind) {
  if (r < 0) fail(fn, w, kind);
  return r;
}

hid_t mem_type(Elem e) {
  switch (e) {
    case Elem::U8: return H5T_NATIVE_UINT8;
    case Elem::U16: return H5T_NATIVE_UINT16;
    case Elem::I32: return H5T_NATIVE_INT32;
    case Elem::U32: return H5T_NATIVE_UINT32;
  }
  return -1;
}
hid_t file_type(Elem e) {
  switch (e) {
    case Elem::U8: return H5T_STD_U8LE;
    case Elem::U16: return H5T_STD_U16LE;
    case Elem::I32: return H5T_STD_I32LE;
    case Elem::U32: return H5T_STD_U32LE;
  }
  return -1;
}

Handle scalar_space(const Where& w) {
  return Handle(check(H5Screate(H5S_SCALAR), "H5Screate", w, "object"), H5Sclose);
}

// Creation property lists with timestamps off: the same file bytes on every run.
Handle dcpl_no_times(const Where& w) {
  Handle p(check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", w, "dataset"), H5Pclose);
  check(H5Pset_obj_track_times(p.id(), 0), "H5Pset_obj_track_times", w, "dataset");
  // Every element is written (whole, or every row of a stack): no fill-value pass first.
  check(H5Pset_fill_time(p.id(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time", w, "dataset");
  return p;
}
Handle gcpl_no_times(const Where& w) {
  Handle p(check(H5Pcreate(H5P_GROUP_CREATE), "H5Pcreate", w, "group"), H5Pclose);
  check(H5Pset_obj_track_times(p.id(), 0), "H5Pset_obj_track_times", w, "group");
  return p;
}

std::string join(const std::string& base, const std::string& name) {
  if (!name.empty() && name[0] == '/') return name;
  if (base.empty() || base == "/") return "/" + name;
  return base + "/" + name;
}

Handle open_attr(const Object& o, const std::string& name) {
  Where w{o.file(), o.path() + " attribute " + name};
  htri_t ex = check(H5Aexists(o.id(), name.c_str()), "H5Aexists", w, "object");
  if (ex == 0) throw Error(w.str("object") + ": attribute is missing");
  return Handle(check(H5Aopen(o.id(), name.c_str(), H5P_DEFAULT), "H5Aopen", w, "object"), H5Aclose);
}

// The attributes of the schema are scalars: reading an array attribute into one value would
// write past it (found by fuzzing: a 2-element tp attribute).
void require_scalar(const Handle& a, const Where& w) {
  Handle s(check(H5Aget_space(a.id()), "H5Aget_space", w, "object"), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(s.id());
  if (n != 1) throw Error(w.str("object") + ": holds " + std::to_string(n) + " values, expected one (a scalar)");
}

void delete_attr_if_present(const Object& o, const std::string& name, const Where& w) {
  htri_t ex = check(H5Aexists(o.id(), name.c_str()), "H5Aexists", w, "object");
  if (ex > 0) check(H5Adelete(o.id(), name.c_str()), "H5Adelete", w, "object");
}

}  // namespace

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::U8: return "uint8";
    case Elem::U16: return "uint16";
    case Elem::I32: return "int32";
    case Elem::U32: return "uint32";
  }
  return "?";
}
size_t elem_size(Elem e) {
  switch (e) {
    case Elem::U8: return 1;
    case Elem::U16: return 2;
    case Elem::I32: return 4;
    case Elem::U32: return 4;
  }
  return 0;
}

void silence_errors() {
  Serial lock(serial_mutex());
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

std::string error_stack() {
  Serial lock(serial_mutex());
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &out);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : out)  // some descriptions hold a ctime() line break: keep the message one line
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

std::string library_version() {
  Serial lock(serial_mutex());
  unsigned a = 0, b = 0, c = 0;
  H5get_libversion(&a, &b, &c);
  return std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
}

std::string Where::str(const char* kind) const {
  std::string s = "file " + file;
  if (!path.empty()) s += ", " + std::string(kind) + " " + path;
  return s;
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
  }
  return *this;
}
void Handle::reset() noexcept {
  Serial lock(serial_mutex());
  if (id_ >= 0 && close_) close_(id_);  // a close failure cannot be reported from here
  id_ = -1;
}

// ---- attributes ------------------------------------------------------------------------

void Object::set_attr(const std::string& name, const std::string& value) const {
  Serial lock(serial_mutex());
  Where w{file(), path() + " attribute " + name};
  delete_attr_if_present(*this, name, w);
  // Variable-length UTF-8, so that h5py (and pandas, HDFView) read a Python str, not bytes.
  // attr_string reads this and the fixed-length NULLPAD form of older goldens.
  Handle t(check(H5Tcopy(H5T_C_S1), "H5Tcopy", w, "object"), H5Tclose);
  check(H5Tset_size(t.id(), H5T_VARIABLE), "H5Tset_size", w, "object");
  check(H5Tset_strpad(t.id(), H5T_STR_NULLTERM), "H5Tset_strpad", w, "object");
  check(H5Tset_cset(t.id(), H5T_CSET_UTF8), "H5Tset_cset", w, "object");
  Handle s = scalar_space(w);
  Handle a(check(H5Acreate2(id(), name.c_str(), t.id(), s.id(), H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2", w, "object"),
           H5Aclose);
  const char* p = value.c_str();
  check(H5Awrite(a.id(), t.id(), &p), "H5Awrite", w, "object");
}

void Object::set_attr(const std::string& name, int64_t value) const {
  Serial lock(serial_mutex());
  Where w{file(), path() + " attribute " + name};
  delete_attr_if_present(*this, name, w);
  Handle s = scalar_space(w);
  Handle a(check(H5Acreate2(id(), name.c_str(), H5T_STD_I64LE, s.id(), H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2", w,
                 "object"),
           H5Aclose);
  check(H5Awrite(a.id(), H5T_NATIVE_INT64, &value), "H5Awrite", w, "object");
}

void Object::set_attr(const std::string& name, double value) const {
  Serial lock(serial_mutex());
  Where w{file(), path() + " attribute " + name};
  delete_attr_if_present(*this, name, w);
  Handle s = scalar_space(w);
  Handle a(check(H5Acreate2(id(), name.c_str(), H5T_IEEE_F64LE, s.id(), H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2", w,
                 "object"),
           H5Aclose);
  check(H5Awrite(a.id(), H5T_NATIVE_DOUBLE, &value), "H5Awrite", w, "object");
}

bool Object::has_attr(const std::string& name) const {
  Serial lock(serial_mutex());
  Where w{file(), path() + " attribute " + name};
  return check(H5Aexists(id(), name.c_str()), "H5Aexists", w, "object") > 0;
}

std::string Object::attr_kind(const std::string& name) const {
  Serial lock(serial_mutex());
  Handle a = open_attr(*this, name);
  Where w{file(), path() + " attribute " + name};
  Handle t(check(H5Aget_type(a.id()), "H5Aget_type", w, "object"), H5Tclose);
  switch (H5Tget_class(t.id())) {
    case H5T_STRING: return "string";
    case H5T_INTEGER: return "int";
    case H5T_FLOAT: return "float";
    default: return "other";
  }
}

std::string Object::attr_string(const std::string& name) const {
  Serial lock(serial_mutex());
  Handle a = open_attr(*this, name);
  Where w{file(), path() + " attribute " + name};
  require_scalar(a, w);
  Handle t(check(H5Aget_type(a.id()), "H5Aget_type", w, "object"), H5Tclose);
  if (H5Tget_class(t.id()) != H5T_STRING) throw Error(w.str("object") + ": is not a string");
  htri_t var = check(H5Tis_variable_str(t.id()), "H5Tis_variable_str", w, "object");
  // The stored type itself as the memory type: no conversion (cset and padding as written).
  Handle mt(check(H5Tcopy(t.id()), "H5Tcopy", w, "object"), H5Tclose);
  if (var > 0) {
    char* p = nullptr;
    check(H5Aread(a.id(), mt.id(), &p), "H5Aread", w, "object");
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t n = H5Tget_size(t.id());
  std::string s(n, '\0');
  check(H5Aread(a.id(), mt.id(), s.data()), "H5Aread", w, "object");
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t Object::attr_int(const std::string& name) const {
  Serial lock(serial_mutex());
  Handle a = open_attr(*this, name);
  Where w{file(), path() + " attribute " + name};
  require_scalar(a, w);
  Handle t(check(H5Aget_type(a.id()), "H5Aget_type", w, "object"), H5Tclose);
  if (H5Tget_class(t.id()) != H5T_INTEGER) throw Error(w.str("object") + ": is not an integer");
  int64_t v = 0;
  check(H5Aread(a.id(), H5T_NATIVE_INT64, &v), "H5Aread", w, "object");
  return v;
}

double Object::attr_double(const std::string& name) const {
  Serial lock(serial_mutex());
  Handle a = open_attr(*this, name);
  Where w{file(), path() + " attribute " + name};
  require_scalar(a, w);
  Handle t(check(H5Aget_type(a.id()), "H5Aget_type", w, "object"), H5Tclose);
  const H5T_class_t c = H5Tget_class(t.id());
  if (c != H5T_FLOAT && c != H5T_INTEGER) throw Error(w.str("object") + ": is not a number");
  double v = 0;
  check(H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v), "H5Aread", w, "object");
  return v;
}

std::vector<std::string> Object::attr_names() const {
  Serial lock(serial_mutex());
  Where w{file(), path()};
  H5O_info_t info;
  check(H5Oget_info2(id(), &info, H5O_INFO_NUM_ATTRS), "H5Oget_info2", w, "object");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    ssize_t n = check(H5Aget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT),
                      "H5Aget_name_by_idx", w, "object");
    std::string s(size_t(n) + 1, '\0');
    check(H5Aget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT),
          "H5Aget_name_by_idx", w, "object");
    s.resize(static_cast<size_t>(n));
    names.push_back(s);
  }
  return names;
}

// ---- datasets --------------------------------------------------------------------------

std::vector<uint64_t> Dataset::shape() const {
  Serial lock(serial_mutex());
  Handle s(check(H5Dget_space(id()), "H5Dget_space", where(), "dataset"), H5Sclose);
  int rank = check(H5Sget_simple_extent_ndims(s.id()), "H5Sget_simple_extent_ndims", where(), "dataset");
  std::vector<hsize_t> d(static_cast<size_t>(rank));
  if (rank > 0) check(H5Sget_simple_extent_dims(s.id(), d.data(), nullptr), "H5Sget_simple_extent_dims", where(), "dataset");
  return std::vector<uint64_t>(d.begin(), d.end());
}

uint64_t Dataset::size() const {
  Serial lock(serial_mutex());
  uint64_t n = 1;
  for (uint64_t d : shape()) n *= d;
  return n;
}

Elem Dataset::elem() const {
  Serial lock(serial_mutex());
  Handle t(check(H5Dget_type(id()), "H5Dget_type", where(), "dataset"), H5Tclose);
  if (H5Tget_class(t.id()) != H5T_INTEGER)
    throw Error(where().str("dataset") + ": stored type is not an integer (goldens store raw bits)");
  const size_t n = H5Tget_size(t.id());
  const bool sgn = H5Tget_sign(t.id()) == H5T_SGN_2;
  if (n == 1 && !sgn) return Elem::U8;
  if (n == 2 && !sgn) return Elem::U16;
  if (n == 4 && sgn) return Elem::I32;
  if (n == 4 && !sgn) return Elem::U32;
  throw Error(where().str("dataset") + ": stored integer type of " + std::to_string(n) + " bytes, " +
              (sgn ? "signed" : "unsigned") + ", is none of uint8, uint16, int32, uint32");
}

void Dataset::write_raw(const void* data, Elem mem) const {
  Serial lock(serial_mutex());
  if (size() == 0) return;
  check(H5Dwrite(id(), mem_type(mem), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", where(), "dataset");
}

void Dataset::read_raw(void* data, Elem mem) const {
  Serial lock(serial_mutex());
  if (size() == 0) return;
  check(H5Dread(id(), mem_type(mem), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dread", where(), "dataset");
}

namespace {
void rows_io(const Dataset& d, uint64_t row, uint64_t n, void* rbuf, const void* wbuf, Elem mem) {
  std::vector<uint64_t> sh = d.shape();
  if (sh.empty() || row + n > sh[0])
    throw Error(d.where().str("dataset") + ": rows [" + std::to_string(row) + ", " + std::to_string(row + n) +
                ") outside the first dimension");
  if (n == 0) return;
  std::vector<hsize_t> start(sh.size(), 0), count(sh.begin(), sh.end());
  start[0] = row;
  count[0] = n;
  Handle fs(check(H5Dget_space(d.id()), "H5Dget_space", d.where(), "dataset"), H5Sclose);
  check(H5Sselect_hyperslab(fs.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
        "H5Sselect_hyperslab", d.where(), "dataset");
  Handle ms(check(H5Screate_simple(int(count.size()), count.data(), nullptr), "H5Screate_simple", d.where(), "dataset"),
            H5Sclose);
  if (wbuf)
    check(H5Dwrite(d.id(), mem_type(mem), ms.id(), fs.id(), H5P_DEFAULT, wbuf), "H5Dwrite", d.where(), "dataset");
  else
    check(H5Dread(d.id(), mem_type(mem), ms.id(), fs.id(), H5P_DEFAULT, rbuf), "H5Dread", d.where(), "dataset");
}
}  // namespace

void Dataset::write_rows(uint64_t row, uint64_t n, const void* data, Elem mem) const {
  Serial lock(serial_mutex());
  rows_io(*this, row, n, nullptr, data, mem);
}
void Dataset::read_rows(uint64_t row, uint64_t n, void* data, Elem mem) const {
  Serial lock(serial_mutex());
  rows_io(*this, row, n, data, nullptr, mem);
}

// ---- groups ----------------------------------------------------------------------------

std::string Group::child_path(const std::string& name) const { return join(path(), name); }

Group Group::create_group(const std::string& name) const {
  Serial lock(serial_mutex());
  Where w{file(), child_path(name)};
  Handle gcpl = gcpl_no_times(w);
  hid_t g = check(H5Gcreate2(id(), name.c_str(), H5P_DEFAULT, gcpl.id(), H5P_DEFAULT), "H5Gcreate2", w, "group");
  return Group(Handle(g, H5Gclose), w);
}

Group Group::open_group(const std::string& name) const {
  Serial lock(serial_mutex());
  Where w{file(), child_path(name)};
  if (!resolves(name)) throw Error(w.str("group") + ": is missing");
  hid_t g = check(H5Gopen2(id(), name.c_str(), H5P_DEFAULT), "H5Gopen2", w, "group");
  return Group(Handle(g, H5Gclose), w);
}

Group Group::require_group(const std::string& name) const {
  return exists(name) ? open_group(name) : create_group(name);
}

namespace {
// Group::exists, following soft-link targets (at most `budget` of them in all: a loop of soft
// links dangles) to refuse an external link that a soft link leads through. *resolves: false
// when the last link is a soft link whose target is not there (HDF5's H5Oexists_by_name fails
// on such a link, instead of answering false, when the target's parent group is missing too).
bool exists_at(const Group& g, const std::string& name, int& budget, bool* resolves) {
  if (resolves) *resolves = true;
  Where w{g.file(), g.child_path(name)};
  // Walk the path so that a missing intermediate group is "absent", not an error.
  std::string acc = (!name.empty() && name[0] == '/') ? "/" : "";
  size_t i = acc.size();
  while (i <= name.size()) {
    size_t j = name.find('/', i);
    if (j == std::string::npos) j = name.size();
    if (j > i) {
      const std::string parent = acc;
      acc += name.substr(i, j - i);
      if (check(H5Lexists(g.id(), acc.c_str(), H5P_DEFAULT), "H5Lexists", w, "object") <= 0) return false;
      // Goldens and dumps hold hard and soft links only: an external link would make every
      // read open another file (found by fuzzing: a dump whose /rank1 linked into a golden
      // took seconds a tensor).
      H5L_info_t li;
      check(H5Lget_info(g.id(), acc.c_str(), &li, H5P_DEFAULT), "H5Lget_info", w, "link");
      if (li.type != H5L_TYPE_HARD && li.type != H5L_TYPE_SOFT) {
        std::string what = "a user-defined link";
        if (li.type == H5L_TYPE_EXTERNAL) {
          std::string buf(li.u.val_size, '\0');
          const char *ef = nullptr, *eo = nullptr;
          unsigned flags = 0;
          what = "an external link";
          if (H5Lget_val(g.id(), acc.c_str(), buf.data(), buf.size(), H5P_DEFAULT) >= 0 &&
              H5Lunpack_elink_val(buf.data(), buf.size(), &flags, &ef, &eo) >= 0 && ef && eo)
            what += std::string(" to ") + ef + ":" + eo;
        }
        throw Error(Where{g.file(), g.child_path(acc)}.str("link") + ": is " + what +
                    "; goldens and dumps hold hard and soft links only");
      }
      if (li.type == H5L_TYPE_SOFT) {
        const std::string t = g.soft_target(acc);
        bool sub = true;  // throws on an external link on the way; a loop runs out of budget: dangling
        if (--budget < 0 || !exists_at(g, t.empty() || t[0] == '/' ? t : parent + t, budget, &sub) || !sub) {
          if (j < name.size()) return false;  // a dangling link on the way: nothing below it
          if (resolves) *resolves = false;    // the last link dangles
        }
      }
      if (j < name.size() &&
          check(H5Oexists_by_name(g.id(), acc.c_str(), H5P_DEFAULT), "H5Oexists_by_name", w, "object") <= 0)
        return false;
      acc += "/";
    }
    i = j + 1;
  }
  return true;
}
}  // namespace

bool Group::exists(const std::string& name) const {
  Serial lock(serial_mutex());
  int budget = 64;
  return exists_at(*this, name, budget, nullptr);
}

bool Group::resolves(const std::string& name) const {
  Serial lock(serial_mutex());
  int budget = 64;
  bool r = true;
  if (!exists_at(*this, name, budget, &r) || !r) return false;
  Where w{file(), child_path(name)};
  return check(H5Oexists_by_name(id(), name.c_str(), H5P_DEFAULT), "H5Oexists_by_name", w, "object") > 0;
}

namespace {
H5O_type_t obj_type(const Group& g, const std::string& name) {
  Where w{g.file(), g.child_path(name)};
  H5O_info_t info;
  check(H5Oget_info_by_name2(g.id(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT), "H5Oget_info_by_name2", w,
        "object");
  return info.type;
}
}  // namespace

bool Group::is_group(const std::string& name) const {
  Serial lock(serial_mutex());
  return resolves(name) && obj_type(*this, name) == H5O_TYPE_GROUP;
}
bool Group::is_dataset(const std::string& name) const {
  Serial lock(serial_mutex());
  return resolves(name) && obj_type(*this, name) == H5O_TYPE_DATASET;
}

std::string Group::soft_target(const std::string& name) const {
  Serial lock(serial_mutex());
  Where w{file(), child_path(name)};
  H5L_info_t info;
  check(H5Lget_info(id(), name.c_str(), &info, H5P_DEFAULT), "H5Lget_info", w, "link");
  if (info.type != H5L_TYPE_SOFT) return "";
  std::string buf(info.u.val_size, '\0');
  check(H5Lget_val(id(), name.c_str(), buf.data(), buf.size(), H5P_DEFAULT), "H5Lget_val", w, "link");
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

void Group::link_soft(const std::string& name, const std::string& target) const {
  Serial lock(serial_mutex());
  Where w{file(), child_path(name)};
  check(H5Lcreate_soft(target.c_str(), id(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), "H5Lcreate_soft", w, "link");
}

namespace {
herr_t child_cb(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Group::children() const {
  Serial lock(serial_mutex());
  std::vector<std::string> out;
  hsize_t idx = 0;
  check(H5Literate(id(), H5_INDEX_NAME, H5_ITER_INC, &idx, child_cb, &out), "H5Literate", where(), "group");
  return out;
}

Dataset Group::create_dataset(const std::string& name, Elem stored, const std::vector<uint64_t>& shape) const {
  Serial lock(serial_mutex());
  Where w{file(), child_path(name)};
  std::vector<hsize_t> d(shape.begin(), shape.end());
  Handle s(check(H5Screate_simple(int(d.size()), d.data(), nullptr), "H5Screate_simple", w, "dataset"), H5Sclose);
  Handle dcpl = dcpl_no_times(w);
  hid_t ds = check(H5Dcreate2(id(), name.c_str(), file_type(stored), s.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                   "H5Dcreate2", w, "dataset");
  return Dataset(Handle(ds, H5Dclose), w);
}

Dataset Group::create_virtual(const std::string& name, Elem stored, const std::vector<uint64_t>& shape,
                              const std::string& src_file, const std::string& src_path,
                              const std::vector<uint64_t>& src_shape, const std::vector<uint64_t>& src_rows) const {
  Where w{file(), child_path(name)};
  if (shape.empty() || src_shape.size() != shape.size() || src_rows.size() != shape[0])
    throw Error(w.str("dataset") + ": virtual dataset of " + std::to_string(src_rows.size()) + " rows over " + src_file +
                ":" + src_path + " does not match its shape");
  for (size_t k = 1; k < shape.size(); ++k)
    if (shape[k] != src_shape[k]) throw Error(w.str("dataset") + ": virtual dataset's row shape differs from " + src_path + "'s");
  std::vector<hsize_t> d(shape.begin(), shape.end()), sd(src_shape.begin(), src_shape.end());
  Handle vs(check(H5Screate_simple(int(d.size()), d.data(), nullptr), "H5Screate_simple", w, "dataset"), H5Sclose);
  Handle ss(check(H5Screate_simple(int(sd.size()), sd.data(), nullptr), "H5Screate_simple", w, "dataset"), H5Sclose);
  Handle dcpl = dcpl_no_times(w);
  check(H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_IFSET), "H5Pset_fill_time", w, "dataset");
  for (size_t i = 0; i < src_rows.size();) {
    size_t n = 1;
    while (i + n < src_rows.size() && src_rows[i + n] == src_rows[i] + n) ++n;
    if (src_rows[i] + n > src_shape[0])
      throw Error(w.str("dataset") + ": source row " + std::to_string(src_rows[i] + n - 1) + " is outside " + src_path);
    std::vector<hsize_t> vstart(d.size(), 0), sstart(d.size(), 0), count(d.begin(), d.end());
    vstart[0] = i;
    sstart[0] = src_rows[i];
    count[0] = n;
    check(H5Sselect_hyperslab(vs.id(), H5S_SELECT_SET, vstart.data(), nullptr, count.data(), nullptr), "H5Sselect_hyperslab", w,
          "dataset");
    check(H5Sselect_hyperslab(ss.id(), H5S_SELECT_SET, sstart.data(), nullptr, count.data(), nullptr), "H5Sselect_hyperslab", w,
          "dataset");
    check(H5Pset_virtual(dcpl.id(), vs.id(), src_file.c_str(), src_path.c_str(), ss.id()), "H5Pset_virtual", w, "dataset");
    i += n;
  }
  check(H5Sselect_all(vs.id()), "H5Sselect_all", w, "dataset");
  hid_t ds = check(H5Dcreate2(id(), name.c_str(), file_type(stored), vs.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                   "H5Dcreate2", w, "dataset");
  return Dataset(Handle(ds, H5Dclose), w);
}

bool Dataset::is_virtual() const {
  Serial lock(serial_mutex());
  Handle p(check(H5Dget_create_plist(id()), "H5Dget_create_plist", where(), "dataset"), H5Pclose);
  return check(H5Pget_layout(p.id()), "H5Pget_layout", where(), "dataset") == H5D_VIRTUAL;
}

Dataset Group::open_dataset(const std::string& name) const {
  Serial lock(serial_mutex());
  Where w{file(), child_path(name)};
  if (!resolves(name)) throw Error(w.str("dataset") + ": is missing");
  hid_t ds = check(H5Dopen2(id(), name.c_str(), H5P_DEFAULT), "H5Dopen2", w, "dataset");
  return Dataset(Handle(ds, H5Dclose), w);
}

// ---- files -----------------------------------------------------------------------------

File::File(const std::string& path, Mode mode) : path_(path) {
  Serial lock(serial_mutex());
  silence_errors();
  guard::note_hdf5_file(path);
  Where w{path, ""};
  hid_t f = -1;
  if (mode == Mode::ReadOnly || mode == Mode::ReadWrite) {
    // A readable file without the HDF5 signature: say so, not HDF5's error stack.
    const htri_t is = H5Fis_hdf5(path.c_str());
    if (is == 0) throw Error(w.str("file") + ": not an HDF5 file (no HDF5 signature in it)");
    H5Eclear2(H5E_DEFAULT);
  }
  switch (mode) {
    case Mode::ReadOnly:
      f = check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", w, "file");
      break;
    case Mode::ReadWrite:
      f = check(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "H5Fopen", w, "file");
      break;
    case Mode::CreateExclusive:
    case Mode::CreateTruncate: {
      Handle fcpl(check(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate", w, "file"), H5Pclose);
      // The root group's timestamps are governed by the file creation list.
      check(H5Pset_obj_track_times(fcpl.id(), 0), "H5Pset_obj_track_times", w, "file");
      f = check(H5Fcreate(path.c_str(), mode == Mode::CreateExclusive ? H5F_ACC_EXCL : H5F_ACC_TRUNC, fcpl.id(),
                          H5P_DEFAULT),
                "H5Fcreate", w, "file");
      break;
    }
  }
  h_ = Handle(f, H5Fclose);
}

Group File::root() const {
  Serial lock(serial_mutex());
  guard::note_hdf5_file(path_);
  Where w{path_, "/"};
  hid_t g = check(H5Gopen2(h_.id(), "/", H5P_DEFAULT), "H5Gopen2", w, "group");
  return Group(Handle(g, H5Gclose), w);
}

void File::close() {
  Serial lock(serial_mutex());
  if (!h_.valid()) return;
  guard::note_hdf5_file(path_);
  Where w{path_, ""};
  check(H5Fflush(h_.id(), H5F_SCOPE_LOCAL), "H5Fflush", w, "file");
  herr_t r = H5Fclose(h_.release());
  if (r < 0) fail("H5Fclose", w, "file");
}

}  // namespace k4::h5
