// weights_file.cpp -- see weights_file.hpp.
#include "golden/format/weights_file.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "golden/format/schema.hpp"
#include "golden/io/atomic_file.hpp"
#include "golden/io/file_check.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/inputs/expert_cache.hpp"

namespace k4::golden {

void Fnv64::add(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  uint64_t x = h;
  for (size_t i = 0; i < n; ++i) x = (x ^ b[i]) * 0x100000001b3ull;
  h = x;
}

std::string Fnv64::hex() const {
  char s[17];
  std::snprintf(s, sizeof s, "%016" PRIx64, h);
  return s;
}

void refuse_weights_file(const Config& c, bool weight_injections, const std::string& option) {
  if (weight_injections)
    throw std::invalid_argument(option + ": the scenario's weight injections (special_weights, nan_weight) change the "
                                "weights, so such a golden holds its own (leave out " + option + ")");
  if (c.variant.router_gate == RouterGate::f32)
    throw std::invalid_argument(option + " with router.gate = f32: a weights file holds the bf16 router gate, not the "
                                "F32 gate this variant reads (leave out " + option + ")");
}

std::string weights_shape(const Config& c) {
  return "hidden " + std::to_string(c.hidden) + ", o_k " + std::to_string(c.o_k()) + ", tp " + std::to_string(c.tp) +
         ", n_routed " + std::to_string(c.n_routed) + ", inter " + std::to_string(c.inter) + ", experts " +
         (c.variant.experts == ExpertFormat::mxfp8 ? "mxfp8" : "mxfp4") + (c.variant.shared_fp8 ? ", shared mxfp8" : "");
}

namespace {

// The datasets of one rank, in the file's (and the hash's) order. Under moe.shared_fp8 (V6.1)
// the stacked MXFP4 tables hold the n_routed routed experts and the MXFP8 shared expert is
// sh_w13 .. sh_s2 (one row each), as in a golden.
struct Item {
  const char* name;
  h5::Elem elem;
  std::vector<uint64_t> shape;
};
std::vector<Item> rank_items(const Config& c) {
  const bool sh8 = c.variant.shared_fp8;
  const uint64_t H = uint64_t(c.hidden), OK = uint64_t(c.o_k()), E = uint64_t(c.n_routed), N = E + (sh8 ? 0 : 1),
                 I = uint64_t(c.inter), per = c.variant.experts == ExpertFormat::mxfp8 ? 1 : 2;
  std::vector<Item> v = {{"w_o", h5::Elem::U8, {H, OK}},           {"s_o", h5::Elem::U32, {H}},
                         {"g_post", h5::Elem::U16, {H}},           {"w_gate", h5::Elem::U16, {E, H}},
                         {"bias", h5::Elem::U32, {E}},             {"w13", h5::Elem::U8, {N, 2 * I, H / per}},
                         {"s13", h5::Elem::U8, {N, 2 * I, H / 32}}, {"w2", h5::Elem::U8, {N, H, I / per}},
                         {"s2", h5::Elem::U8, {N, H, I / 32}}};
  if (sh8)
    v.insert(v.end(), {{"sh_w13", h5::Elem::U8, {1, 2 * I, H}},
                       {"sh_s13", h5::Elem::U8, {1, 2 * I, H / 32}},
                       {"sh_w2", h5::Elem::U8, {1, H, I}},
                       {"sh_s2", h5::Elem::U8, {1, H, I / 32}}});
  return v;
}

// The experts in the stacked tables: all n_routed + 1, or the routed ones under moe.shared_fp8.
int table_experts(const Config& c) { return c.n_routed + (c.variant.shared_fp8 ? 0 : 1); }

using ExpertTable = std::vector<uint8_t> ExpertWeights::*;
constexpr ExpertTable kTables[4] = {&ExpertWeights::w13, &ExpertWeights::s13, &ExpertWeights::w2, &ExpertWeights::s2};

std::recursive_mutex& wf_mutex() { return h5::serial_mutex(); }  // the one HDF5 lock (hdf5.hpp)

}  // namespace

std::string write_weights_file(const std::string& path, const LayerWeights& lw, const WeightsSource& src,
                               const std::function<void(uint64_t, uint64_t)>& progress) {
  const Config& c = lw.cfg;
  const std::vector<Item> items = rank_items(c);
  uint64_t total = 0, done = 0;
  for (const Item& it : items) {
    uint64_t n = h5::elem_size(it.elem);
    for (uint64_t d : it.shape) n *= d;
    total += n * uint64_t(c.tp);
  }
  AtomicOutput out(path, false);
  Fnv64 whole;
  {
    h5::File f(out.temp_path(), h5::File::Mode::CreateExclusive);
    h5::Group root = f.root();
    root.set_attr("magic", kWeightsMagic);
    root.set_attr("weights_version", int64_t(kWeightsVersion));
    root.set_attr("config", config_to_json(c));
    root.set_attr("shape", weights_shape(c));
    root.set_attr("weights", src.weights);
    root.set_attr("weight_seed", int64_t(src.weight_seed));
    root.set_attr("weight_prep", src.weight_prep);
    root.set_attr("weight_layer", int64_t(src.weight_layer));
    auto tick = [&](uint64_t n) {
      count_written(n);
      done += n;
      if (progress) progress(done, total);
    };
    for (int r = 0; r < c.tp; ++r) {
      const RankWeights& w = lw.ranks[size_t(r)];
      h5::Group g = root.create_group("rank" + std::to_string(r));
      auto dense = [&](const Item& it, const void* data, size_t bytes) {
        h5::Dataset d = g.create_dataset(it.name, it.elem, it.shape);
        d.write_raw(data, it.elem);
        Fnv64 h;
        h.add(data, bytes);
        whole.add(&h.h, 8);
        tick(bytes);
      };
      dense(items[0], w.w_o.data(), w.w_o.size());
      dense(items[1], w.s_o.data(), w.s_o.size() * 4);
      dense(items[2], w.g_post.data(), w.g_post.size() * 2);
      dense(items[3], w.w_gate.data(), w.w_gate.size() * 2);
      dense(items[4], w.bias.data(), w.bias.size() * 4);
      std::vector<h5::Dataset> ds;
      for (size_t k = 5; k < 9; ++k) ds.push_back(g.create_dataset(items[k].name, h5::Elem::U8, items[k].shape));
      Fnv64 h[4];
      const int N = table_experts(c);
      constexpr int kBatch = 8;  // materialized in parallel (the sources are thread-safe), written in id order
      for (int e0 = 0; e0 < N; e0 += kBatch) {
        const int nb = std::min(kBatch, N - e0);
        const size_t nbs = static_cast<size_t>(nb);
        std::vector<std::shared_ptr<const ExpertWeights>> batch(nbs);
        std::vector<std::string> errors(nbs);
#pragma omp parallel for schedule(dynamic)
        for (int j = 0; j < nb; ++j) {
          try {
            batch[size_t(j)] = lw.experts->expert(r, e0 + j);
          } catch (const std::exception& x) {
            errors[size_t(j)] = x.what();
          }
        }
        for (int j = 0; j < nb; ++j) {
          if (!errors[size_t(j)].empty())
            throw std::invalid_argument("weights file " + path + ": expert " + std::to_string(e0 + j) + ": " + errors[size_t(j)]);
          for (size_t k = 0; k < 4; ++k) {
            const std::vector<uint8_t>& v = (*batch[size_t(j)]).*(kTables[k]);
            const uint64_t per = items[5 + k].shape[1] * items[5 + k].shape[2];
            if (v.size() != per)
              throw std::logic_error("weights file: expert " + std::to_string(e0 + j) + " " + items[5 + k].name + " has " +
                                     std::to_string(v.size()) + " bytes, expected " + std::to_string(per));
            ds[k].write_rows(uint64_t(e0 + j), 1, v.data(), h5::Elem::U8);
            h[k].add(v.data(), v.size());
            tick(per);
          }
        }
      }
      for (const Fnv64& x : h) whole.add(&x.h, 8);
      if (c.variant.shared_fp8) {  // V6.1: the MXFP8 shared expert, its own one-row tables
        const std::shared_ptr<const ExpertWeights> sh = lw.experts->expert(r, c.shared_expert());
        for (size_t k = 0; k < 4; ++k) {
          const Item& it = items[9 + k];
          const std::vector<uint8_t>& v = (*sh).*(kTables[k]);
          if (v.size() != it.shape[1] * it.shape[2])
            throw std::logic_error("weights file: the shared expert's " + std::string(it.name) + " has " +
                                   std::to_string(v.size()) + " bytes, expected " + std::to_string(it.shape[1] * it.shape[2]));
          dense(it, v.data(), v.size());
        }
      }
    }
    root.set_attr("hash", whole.hex());
    f.close();
  }
  out.commit();
  return whole.hex();
}

// ---- reading ---------------------------------------------------------------------------

struct WeightsFile::Impl {
  std::string path, hash;
  h5::File file;
  h5::Group root;
  Config cfg;
  WeightsSource src;

  [[noreturn]] void bad(const std::string& what) const { throw FormatError("weights file " + path + ": " + what); }
  std::string str(const std::string& name) const {
    if (!root.has_attr(name) || root.attr_kind(name) != "string") bad("string attribute '" + name + "' is missing");
    return root.attr_string(name);
  }
  int64_t num(const std::string& name) const {
    if (!root.has_attr(name) || root.attr_kind(name) != "int") bad("integer attribute '" + name + "' is missing");
    return root.attr_int(name);
  }
};

WeightsFile::WeightsFile(const std::string& path) : p_(std::make_shared<Impl>()) {
  Impl& m = *p_;
  m.path = path;
  try {
    require_input_file(path, "weights file");
  } catch (const std::invalid_argument& e) {
    throw FormatError(e.what());
  }
  std::lock_guard<std::recursive_mutex> lock(wf_mutex());
  try {
    m.file = h5::File(path, h5::File::Mode::ReadOnly);
    m.root = m.file.root();
    if (!m.root.has_attr("magic") || m.root.attr_kind("magic") != "string" || m.root.attr_string("magic") != kWeightsMagic)
      m.bad(std::string("not a K4 weights file (no magic '") + kWeightsMagic + "' at /)");
    const int64_t v = m.num("weights_version");
    if (v != kWeightsVersion)
      m.bad("weights_version " + std::to_string(v) + "; this tool reads version " + std::to_string(kWeightsVersion));
    m.cfg = config_from_json(m.str("config"), "weights file " + path);
    m.hash = m.str("hash");
    m.src.weights = m.str("weights");
    m.src.weight_seed = uint64_t(m.num("weight_seed"));
    m.src.weight_prep = m.str("weight_prep");
    m.src.weight_layer = int(m.num("weight_layer"));
    const std::vector<Item> items = rank_items(m.cfg);
    for (int r = 0; r < m.cfg.tp; ++r)
      for (const Item& it : items) {
        const std::string p = "/rank" + std::to_string(r) + "/" + it.name;
        if (!m.root.resolves(p) || !m.root.is_dataset(p)) m.bad("dataset " + p + " is missing");
        const h5::Dataset d = m.root.open_dataset(p);
        if (d.elem() != it.elem) m.bad("dataset " + p + " is stored as " + h5::elem_name(d.elem()) + ", expected " + h5::elem_name(it.elem));
        if (d.shape() != it.shape) m.bad("dataset " + p + " has shape " + shape_str(d.shape()) + ", expected " + shape_str(it.shape));
      }
  } catch (const h5::Error& e) {
    throw FormatError("weights file " + path + ": " + e.what());
  }
}

const std::string& WeightsFile::path() const { return p_->path; }
const std::string& WeightsFile::hash() const { return p_->hash; }
const Config& WeightsFile::config() const { return p_->cfg; }
WeightsSource WeightsFile::source() const { return p_->src; }

void WeightsFile::require_matches(const Config& c, const WeightsSource& s) const {
  const WeightsSource& m = p_->src;
  std::string d;
  auto diff = [&](const std::string& what, const std::string& here, const std::string& want) {
    if (here != want) d += (d.empty() ? "" : "; ") + what + " '" + here + "' (this golden's: '" + want + "')";
  };
  diff("shape", weights_shape(p_->cfg), weights_shape(c));
  diff("weights", m.weights, s.weights);
  diff("weight_seed", std::to_string(m.weight_seed), std::to_string(s.weight_seed));
  diff("weight_layer", std::to_string(m.weight_layer), std::to_string(s.weight_layer));
  diff("weight_prep", m.weight_prep, s.weight_prep);
  if (!d.empty())
    throw std::invalid_argument("weights file " + p_->path + " holds other weights than this golden's: " + d +
                                "; give another --weights-file (a new name is written)");
}

void WeightsFile::verify() const {
  std::lock_guard<std::recursive_mutex> lock(wf_mutex());
  Fnv64 whole;
  try {
    for (int r = 0; r < p_->cfg.tp; ++r)
      for (const Item& it : rank_items(p_->cfg)) {
        const h5::Dataset d = p_->root.open_dataset("/rank" + std::to_string(r) + "/" + it.name);
        const std::vector<uint64_t> sh = d.shape();
        uint64_t row = h5::elem_size(it.elem);
        for (size_t k = 1; k < sh.size(); ++k) row *= sh[k];
        const uint64_t step = std::max<uint64_t>(1, (16u << 20) / row);
        std::vector<uint8_t> buf(size_t(std::min(step, sh[0]) * row));
        Fnv64 h;
        for (uint64_t i = 0; i < sh[0]; i += step) {
          const uint64_t n = std::min(step, sh[0] - i);
          d.read_rows(i, n, buf.data(), it.elem);
          h.add(buf.data(), size_t(n * row));
        }
        whole.add(&h.h, 8);
      }
  } catch (const h5::Error& e) {
    throw FormatError("weights file " + p_->path + ": " + e.what());
  }
  if (whole.hex() != p_->hash)
    p_->bad("its contents hash to " + whole.hex() + ", but its attribute hash says " + p_->hash +
            ": the file was changed after it was written (write a new one)");
}

namespace {

class FileExpertSource : public ExpertSource {
 public:
  FileExpertSource(std::shared_ptr<const WeightsFile::Impl> p, const Config& c) : p_(std::move(p)), c_(c) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    if (rank < 0 || rank >= c_.tp || e < 0 || e > c_.n_routed)
      throw std::invalid_argument("weights file " + p_->path + ": expert(" + std::to_string(rank) + ", " + std::to_string(e) +
                                  ") is outside rank 0.." + std::to_string(c_.tp - 1) + ", expert 0.." +
                                  std::to_string(c_.n_routed));
    return cache_.get(rank, e, [&] { return read_expert(rank, e); });
  }

 private:
  std::shared_ptr<const ExpertWeights> read_expert(int rank, int e) const {
    std::lock_guard<std::recursive_mutex> lock(wf_mutex());
    auto ew = std::make_shared<ExpertWeights>();
    // moe.shared_fp8: the shared expert is row 0 of sh_w13 .. sh_s2
    const bool sh8 = c_.variant.shared_fp8 && e == c_.shared_expert();
    const std::string g = "/rank" + std::to_string(rank) + "/" + (sh8 ? "sh_" : "");
    auto read = [&](const char* name, std::vector<uint8_t>& v) {
      const h5::Dataset d = p_->root.open_dataset(g + name);
      const std::vector<uint64_t> sh = d.shape();
      v.resize(size_t(sh[1] * sh[2]));
      d.read_rows(sh8 ? 0 : uint64_t(e), 1, v.data(), h5::Elem::U8);
    };
    try {
      read("w13", ew->w13);
      read("s13", ew->s13);
      read("w2", ew->w2);
      read("s2", ew->s2);
    } catch (const h5::Error& x) {
      throw FormatError("weights file " + p_->path + ": " + x.what());
    }
    return ew;
  }

  std::shared_ptr<const WeightsFile::Impl> p_;
  Config c_;
  ExpertCache cache_{32};
};

}  // namespace

LayerWeights WeightsFile::weights(const Config& c) const {
  LayerWeights lw;
  lw.cfg = c;
  std::lock_guard<std::recursive_mutex> lock(wf_mutex());
  try {
    for (int r = 0; r < c.tp; ++r) {
      const std::string g = "/rank" + std::to_string(r) + "/";
      RankWeights w;
      w.w_o = p_->root.open_dataset(g + "w_o").read<uint8_t>();
      const std::vector<uint32_t> s_o = p_->root.open_dataset(g + "s_o").read<uint32_t>();
      w.s_o.resize(s_o.size());
      std::memcpy(w.s_o.data(), s_o.data(), s_o.size() * 4);
      w.g_post = p_->root.open_dataset(g + "g_post").read<uint16_t>();
      w.w_gate = p_->root.open_dataset(g + "w_gate").read<uint16_t>();
      const std::vector<uint32_t> b = p_->root.open_dataset(g + "bias").read<uint32_t>();
      w.bias.resize(b.size());
      std::memcpy(w.bias.data(), b.data(), b.size() * 4);
      lw.ranks.push_back(std::move(w));
    }
  } catch (const h5::Error& x) {
    throw FormatError("weights file " + p_->path + ": " + x.what());
  }
  lw.experts = std::make_shared<FileExpertSource>(p_, c);
  return lw;
}

// A golden whose weights are in a weights file (weights_file.hpp): the file is where the
// attribute says (relative to this golden's directory), is the one recorded (its hash), and
// every virtual dataset reads the bytes the golden was written with (source_hash). HDF5
// reads zeros where a source is missing: these checks turn that into an error.
void check_weights_refs(const std::string& path, const h5::Group& root) {
  if (!root.has_attr("weights_file")) return;
  auto bad = [&](const std::string& what) { throw FormatError("golden " + path + ": " + what); };
  const int tp = root.has_attr("tp") && root.attr_kind("tp") == "int" ? int(root.attr_int("tp")) : 0;
  namespace fs = std::filesystem;
  std::string rel, want;
  try {
    const nlohmann::json j = nlohmann::json::parse(root.attr_kind("weights_file") == "string" ? root.attr_string("weights_file") : std::string());
    rel = j.at("path").get<std::string>();
    want = j.at("hash").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    bad("attribute weights_file is not {\"path\": ..., \"hash\": ...} (" + std::string(e.what()) + ")");
  }
  const fs::path p = fs::path(rel).is_absolute() ? fs::path(rel) : fs::path(path).parent_path() / rel;
  std::error_code ec;
  if (!fs::exists(p, ec))
    bad("its weights are in the weights file '" + rel + "' (attribute weights_file), which is not at " + p.string() +
        ": the golden was moved without its weights file, or the weights file was moved or removed");
  std::string got;
  try {
    got = WeightsFile(p.string()).hash();
  } catch (const FormatError& e) {
    bad(std::string("its weights file: ") + e.what());
  }
  if (got != want)
    bad("its weights file " + p.string() + " has content hash " + got + ", but the golden was written against " + want +
        ": the weights file was replaced or rewritten (make the golden again, or put its own weights file back)");
  for (int r = 0; r < tp; ++r)
    for (const char* n : {"oproj/inputs/w_o", "moe/inputs/w13", "moe/inputs/s13", "moe/inputs/w2", "moe/inputs/s2",
                          "moe/inputs/sh_w13", "moe/inputs/sh_s13", "moe/inputs/sh_w2", "moe/inputs/sh_s2"}) {
      const std::string dp = "/rank" + std::to_string(r) + "/" + n;
      if (std::string(n).find("/sh_") != std::string::npos && !root.resolves(dp)) continue;  // moe.shared_fp8 only
      const h5::Dataset d = root.open_dataset(dp);
      if (!d.is_virtual()) continue;
      if (!d.has_attr("source_hash")) bad("dataset " + dp + " is virtual but has no source_hash attribute");
      const std::vector<uint64_t> sh = d.shape();
      uint64_t row = 1;
      for (size_t k = 1; k < sh.size(); ++k) row *= sh[k];
      const uint64_t step = std::max<uint64_t>(1, (16u << 20) / std::max<uint64_t>(row, 1));
      std::vector<uint8_t> buf(size_t(std::min(step, sh.empty() ? 0 : sh[0]) * row));
      Fnv64 h;
      for (uint64_t i = 0; i < sh[0]; i += step) {
        const uint64_t k = std::min(step, sh[0] - i);
        d.read_rows(i, k, buf.data(), h5::Elem::U8);
        h.add(buf.data(), size_t(k * row));
      }
      if (h.hex() != d.attr_string("source_hash"))
        bad("dataset " + dp + " reads bytes from weights file " + p.string() + " that hash to " + h.hex() + ", expected " +
            d.attr_string("source_hash") + ": the weights file changed after the golden was written");
    }
}

}  // namespace k4::golden
