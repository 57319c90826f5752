// cmd_inspect.cpp -- k4 inspect FILE: the root attributes, then every group, link and
// dataset: dtype, shape, dims, and a summary of the decoded values (min / max / mean of the
// finite ones, NaN, Inf and zero counts) with a few decoded samples and their bits.
// --json: the same content as one JSON object on stdout (file, attributes, variant, groups,
// links, datasets); nothing is printed before the file has been opened and validated.
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden/diff/compare.hpp"
#include "golden/io/file_check.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/format/schema.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"
#include "tools/commands.hpp"

namespace k4::tools {
namespace {

struct Stats {
  uint64_t n = 0, nan = 0, inf = 0, zero = 0, finite = 0;
  double mn = INFINITY, mx = -INFINITY, sum = 0;
  void add(double v) {
    ++n;
    if (std::isnan(v)) { ++nan; return; }
    if (std::isinf(v)) { ++inf; return; }
    if (v == 0) ++zero;
    ++finite;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sum += v;
  }
};

// Element i decoded, and its bits as hex.
struct Decoder {
  golden::DType dt;
  const std::vector<uint8_t>* u8 = nullptr;
  const std::vector<uint16_t>* u16 = nullptr;
  const std::vector<uint32_t>* u32 = nullptr;
  const std::vector<int32_t>* i32 = nullptr;
  uint64_t count() const {
    switch (dt) {
      case golden::DType::BF16: return u16->size();
      case golden::DType::F32: return u32->size();
      case golden::DType::I32: return i32->size();
      case golden::DType::E2M1X2: return 2 * u8->size();
      default: return u8->size();
    }
  }
  double value(uint64_t i) const {
    switch (dt) {
      case golden::DType::BF16: return bf16_to_f32((*u16)[i]);
      case golden::DType::F32: return f32_from_bits((*u32)[i]);
      case golden::DType::I32: return (*i32)[i];
      case golden::DType::U8: return (*u8)[i];
      case golden::DType::E4M3: return e4m3_to_f32((*u8)[i]);
      case golden::DType::E8M0: return e8m0_to_f32((*u8)[i]);
      case golden::DType::E2M1X2: {
        const uint8_t b = (*u8)[i / 2];
        return e2m1_to_f32(i % 2 ? fp4_hi(b) : fp4_lo(b));
      }
    }
    return 0;
  }
  std::string bits(uint64_t i) const {
    char buf[32];
    switch (dt) {
      case golden::DType::BF16: std::snprintf(buf, sizeof buf, "0x%04x", (*u16)[i]); break;
      case golden::DType::F32: std::snprintf(buf, sizeof buf, "0x%08x", (*u32)[i]); break;
      case golden::DType::I32: std::snprintf(buf, sizeof buf, "0x%08x", uint32_t((*i32)[i])); break;
      case golden::DType::E2M1X2: {
        const uint8_t b = (*u8)[i / 2];
        std::snprintf(buf, sizeof buf, "0x%x", i % 2 ? fp4_hi(b) : fp4_lo(b));
        break;
      }
      default: std::snprintf(buf, sizeof buf, "0x%02x", (*u8)[i]); break;
    }
    return buf;
  }
};

std::string fmt(double v, golden::DType dt) {
  char buf[48];
  if (dt == golden::DType::I32 || dt == golden::DType::U8) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

using Json = nlohmann::ordered_json;

// A JSON number, or null for NaN / Inf (JSON has neither).
Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

// json: the dataset's object is appended to (*json)["datasets"] instead of printed.
void show_dataset(const h5::Group& root, const std::string& path, int samples, bool stats, Json* json) {
  h5::Dataset d = root.open_dataset(path);
  const std::vector<uint64_t> sh = d.shape();
  std::string shape;
  for (size_t i = 0; i < sh.size(); ++i) shape += (i ? "," : "") + std::to_string(sh[i]);
  const std::string dts = d.has_attr("dtype") ? d.attr_string("dtype") : std::string("?");
  const std::string dims = d.has_attr("dims") ? d.attr_string("dims") : std::string("");
  Json* jd = nullptr;
  const bool virt = d.is_virtual();  // k4 golden --weights-file: the weights file holds the bytes
  if (json) {
    Json o;
    o["path"] = path;
    o["dtype"] = dts;
    o["shape"] = sh;
    o["dims"] = dims;
    if (virt) o["virtual"] = true;
    (*json)["datasets"].push_back(o);
    jd = &(*json)["datasets"].back();
  } else {
    std::printf("  %-44s %-7s (%s) [%s]%s\n", path.c_str(), dts.c_str(), shape.c_str(), dims.c_str(),
                virt ? "  virtual: in the weights file" : "");
  }
  golden::DType dt;
  if (!stats || !golden::dtype_from_name(dts, dt)) return;
  std::vector<uint8_t> u8;
  std::vector<uint16_t> u16;
  std::vector<uint32_t> u32;
  std::vector<int32_t> i32;
  Decoder dec{dt};
  switch (dt) {
    case golden::DType::BF16: u16 = d.read<uint16_t>(); dec.u16 = &u16; break;
    case golden::DType::F32: u32 = d.read<uint32_t>(); dec.u32 = &u32; break;
    case golden::DType::I32: i32 = d.read<int32_t>(); dec.i32 = &i32; break;
    default: u8 = d.read<uint8_t>(); dec.u8 = &u8; break;
  }
  // Narrow codes are counted first (a histogram of the 16 / 256 / 65536 codes), then each
  // distinct code decoded once: fast on the GB-sized expert stacks.
  Stats s;
  const uint64_t n = dec.count();
  if (dt == golden::DType::F32 || dt == golden::DType::I32) {
    for (uint64_t i = 0; i < n; ++i) s.add(dec.value(i));
  } else {
    std::vector<uint64_t> hist(dt == golden::DType::BF16 ? 65536 : 256, 0);
    if (dt == golden::DType::BF16) for (uint16_t v : u16) ++hist[v];
    else for (uint8_t v : u8) ++hist[v];
    auto add_n = [&](double v, uint64_t k) {
      if (k == 0) return;
      s.n += k;
      if (std::isnan(v)) { s.nan += k; return; }
      if (std::isinf(v)) { s.inf += k; return; }
      if (v == 0) s.zero += k;
      s.finite += k;
      s.mn = std::min(s.mn, v);
      s.mx = std::max(s.mx, v);
      s.sum += v * double(k);
    };
    for (size_t c = 0; c < hist.size(); ++c) {
      if (!hist[c]) continue;
      switch (dt) {
        case golden::DType::BF16: add_n(bf16_to_f32(uint16_t(c)), hist[c]); break;
        case golden::DType::U8: add_n(double(c), hist[c]); break;
        case golden::DType::E4M3: add_n(e4m3_to_f32(uint8_t(c)), hist[c]); break;
        case golden::DType::E8M0: add_n(e8m0_to_f32(uint8_t(c)), hist[c]); break;
        case golden::DType::E2M1X2:  // two elements a byte
          add_n(e2m1_to_f32(fp4_lo(uint8_t(c))), hist[c]);
          add_n(e2m1_to_f32(fp4_hi(uint8_t(c))), hist[c]);
          break;
        default: break;
      }
    }
  }
  if (jd) {
    Json st;
    st["count"] = n;
    st["finite"] = s.finite;
    st["min"] = s.finite ? number(s.mn) : Json(nullptr);
    st["max"] = s.finite ? number(s.mx) : Json(nullptr);
    st["mean"] = s.finite ? number(s.sum / double(s.finite)) : Json(nullptr);
    st["nan"] = s.nan;
    st["inf"] = s.inf;
    st["zero"] = s.zero;
    (*jd)["stats"] = st;
    Json sm = Json::array();
    const uint64_t k = std::min<uint64_t>(uint64_t(std::max(samples, 0)), n);
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t i = k == 1 ? 0 : j * (n - 1) / (k - 1);  // spread over the tensor, as the text's
      sm.push_back(Json{{"index", i}, {"value", number(dec.value(i))}, {"bits", dec.bits(i)}});
    }
    (*jd)["samples"] = sm;
    return;
  }
  if (s.finite)
    std::printf("      min %s max %s mean %.6g", fmt(s.mn, dt).c_str(), fmt(s.mx, dt).c_str(), s.sum / double(s.finite));
  else
    std::printf("      no finite value");
  std::printf("  nan %" PRIu64 " inf %" PRIu64 " zero %" PRIu64 " of %" PRIu64 "\n", s.nan, s.inf, s.zero, n);
  if (samples > 0 && n > 0) {
    std::printf("      samples");
    const uint64_t k = std::min<uint64_t>(uint64_t(samples), n);
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t i = k == 1 ? 0 : j * (n - 1) / (k - 1);  // spread over the tensor
      std::printf(" [%" PRIu64 "]=%s(%s)", i, fmt(dec.value(i), dt).c_str(), dec.bits(i).c_str());
    }
    std::printf("\n");
  }
}

// The attributes of an object as JSON (strings, integers, floats; "?" for other kinds).
Json attrs_json(const h5::Object& o) {
  Json a = Json::object();
  for (const std::string& n : o.attr_names()) {
    const std::string k = o.attr_kind(n);
    a[n] = k == "string" ? Json(o.attr_string(n)) : k == "int" ? Json(o.attr_int(n)) : k == "float" ? number(o.attr_double(n)) : Json("?");
  }
  return a;
}

// Path p is the object `prefix` or under it (whole names: /rank0/merge/outputs/attn is not
// under .../at, nor .../attn8 under .../attn); "" and "/" hold everything.
bool within(const std::string& p, const std::string& prefix) {
  if (prefix.empty() || prefix == "/") return true;
  return p.compare(0, prefix.size(), prefix) == 0 && (p.size() == prefix.size() || p[prefix.size()] == '/');
}

void walk(const h5::Group& root, const std::string& path, int samples, bool stats, const std::string& prefix, Json* json) {
  h5::Group g = root.open_group(path);
  for (const std::string& c : g.children()) {
    const std::string p = (path == "/" ? "" : path) + "/" + c;
    const bool under = within(p, prefix) || within(prefix, p);  // in it, or on the way to it
    if (!under) continue;
    const std::string target = g.soft_target(c);
    if (!target.empty()) {
      if (within(p, prefix)) {
        if (json)
          (*json)["links"].push_back(Json{{"path", p}, {"target", target}, {"dangling", !g.resolves(c)}});
        else
          std::printf("  %-44s -> %s%s\n", p.c_str(), target.c_str(), g.resolves(c) ? "" : "  (DANGLING)");
      }
      continue;
    }
    if (g.is_group(c)) {
      if (json && (within(p, prefix))) {
        (*json)["groups"].push_back(Json{{"path", p}, {"attributes", attrs_json(g.open_group(c))}});
      } else if (within(p, prefix)) {
        h5::Group sub = g.open_group(c);
        std::string attrs;
        for (const std::string& a : sub.attr_names()) {
          const std::string k = sub.attr_kind(a);
          attrs += " " + a + "=" +
                   (k == "string" ? sub.attr_string(a) : k == "int" ? std::to_string(sub.attr_int(a)) : std::string("?"));
        }
        std::printf("%s/%s\n", p.c_str(), attrs.c_str());
      }
      walk(root, p, samples, stats, prefix, json);
    } else if (g.is_dataset(c)) {
      if (within(p, prefix)) show_dataset(root, p, samples, stats, json);
    }
  }
}

}  // namespace

Run add_inspect(CLI::App& app) {
  struct Opt {
    std::string file, path;
    int samples = 4;
    bool no_stats = false, no_validate = false, json = false;
  };
  auto o = std::make_shared<Opt>();
  app.add_option("file", o->file, "golden (or inputs) HDF5 file")->required();
  app.add_option("--path", o->path, "only objects under this path (e.g. /rank0/moe)");
  app.add_option("--samples", o->samples, "decoded samples a dataset (default 4)")->check(CLI::Range(0, 1000000));
  app.add_flag("--no-stats", o->no_stats, "shapes and dtypes only (fast on big files)");
  app.add_flag("--no-validate", o->no_validate, "skip the schema validation (show a damaged file)");
  app.add_flag("--json", o->json,
               "the same as one JSON object on stdout: file, attributes, variant, groups, links, datasets (dtype, shape, dims, "
               "stats, samples; NaN / Inf as null)");
  return [o]() {
    require_input_file(o->file, "file");
    try {
      h5::File probe(o->file, h5::File::Mode::ReadOnly);
    } catch (const h5::Error& e) {
      throw std::invalid_argument(o->file + " cannot be opened as HDF5 (" + e.what() + ")");
    }
    if (!o->no_validate) {
      std::string magic, kind;
      {
        h5::File f(o->file, h5::File::Mode::ReadOnly);
        const h5::Group root = f.root();
        if (root.has_attr("magic") && root.attr_kind("magic") == "string") magic = root.attr_string("magic");
        if (root.has_attr("kind") && root.attr_kind("kind") == "string") kind = root.attr_string("kind");
      }
      // Each kind of file is checked by its reader (FormatError: exit 2); --no-validate shows a damaged one.
      if (magic == golden::kMagic && kind == "dump") golden::DumpReader check(o->file, "dump");
      else if (magic == golden::kMagic) golden::GoldenReader check(o->file);
      else if (magic == golden::kInputsMagic) golden::read_inputs_file(o->file);
    }
    h5::File f(o->file, h5::File::Mode::ReadOnly);
    const h5::Group root = f.root();
    if (!o->path.empty() && o->path[0] != '/') o->path = "/" + o->path;  // rank0/moe = /rank0/moe
    while (o->path.size() > 1 && o->path.back() == '/') o->path.pop_back();  // /rank0/moe/ = /rank0/moe
    if (!o->path.empty() && o->path != "/" && !root.exists(o->path))
      throw std::invalid_argument("--path " + o->path + ": no such group or dataset in " + o->file);
    // the build the file was made for (docs/numerics.md §13), from its config: a dump or a
    // version 1 golden without the variant attribute shows it too
    std::string variant, variant_unknown;
    if (root.has_attr("config") && root.attr_kind("config") == "string") {
      try {
        variant = variant_name(golden::config_from_json(root.attr_string("config"), o->file).variant);
      } catch (const golden::FormatError& e) {
        if (!o->no_validate) throw;
        variant_unknown = e.what();
      }
    }
    if (o->json) {  // built whole, then printed: an error leaves stdout empty
      Json j;
      j["file"] = o->file;
      j["attributes"] = attrs_json(root);
      j["variant"] = variant.empty() ? Json(nullptr) : Json(variant);
      if (!variant_unknown.empty()) j["variant_error"] = variant_unknown;
      j["groups"] = Json::array();
      j["links"] = Json::array();
      j["datasets"] = Json::array();
      walk(root, "/", o->no_stats ? 0 : o->samples, !o->no_stats, o->path, &j);
      std::printf("%s\n", j.dump(1).c_str());
      return 0;
    }
    std::printf("%s\n", o->file.c_str());
    for (const std::string& a : root.attr_names()) {
      const std::string k = root.attr_kind(a);
      const std::string v = k == "string" ? root.attr_string(a)
                            : k == "int"  ? std::to_string(root.attr_int(a))
                            : k == "float" ? std::to_string(root.attr_double(a))
                                           : std::string("?");
      std::printf("  @%s = %s\n", a.c_str(), v.c_str());
    }
    if (!variant.empty()) std::printf("  variant (from the config): %s\n", variant.c_str());
    else if (!variant_unknown.empty()) std::printf("  variant: unknown (%s)\n", variant_unknown.c_str());
    walk(root, "/", o->no_stats ? 0 : o->samples, !o->no_stats, o->path, nullptr);
    return 0;
  };
}

}  // namespace k4::tools
