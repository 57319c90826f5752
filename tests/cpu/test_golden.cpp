// test_golden.cpp -- the golden file: write / read round trips bit for bit, refusal to
// overwrite, no temporary left on failure, validation messages, byte-identical files for any
// thread count, and h5dump can read it.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>

#include "golden/io/hdf5.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"

namespace fs = std::filesystem;
using namespace k4;

namespace {

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("k4_test_golden_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Case {
  Config cfg;
  LayerWeights w;
  StepInputs in;
  StepResult res;
  golden::GoldenMeta meta;
};

Case make_case(int tokens, const std::string& context = "1000", uint64_t seed = 3) {
  Case c;
  c.cfg = preset("tiny");
  Scenario s;
  s.tokens = tokens;
  s.context = {context};
  apply_scenario(s, c.cfg);
  c.w = synth::synthetic_layer(c.cfg, 7);
  c.in = make_inputs(c.cfg, s, seed, &c.w);
  c.res = run_step(c.w, c.in);
  c.meta.scenario_json = scenario_to_json(s);
  c.meta.weight_seed = 7;
  c.meta.input_seed = seed;
  return c;
}

// One step a (tokens, context, seed), computed once for the cases that only read it.
const Case& shared_case(int tokens, const std::string& context = "1000", uint64_t seed = 3) {
  static std::vector<std::pair<std::string, std::unique_ptr<Case>>> cache;
  const std::string key = std::to_string(tokens) + "/" + context + "/" + std::to_string(seed);
  for (auto& kv : cache)
    if (kv.first == key) return *kv.second;
  cache.push_back({key, std::make_unique<Case>(make_case(tokens, context, seed))});
  return *cache.back().second;
}

template <class T>
bool any_nonzero(const std::vector<T>& v) {
  for (const T& x : v)
    if (x != T(0)) return true;
  return false;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void check_rank_equal(const RankResult& a, const RankResult& b) {
  CHECK(same_bits(a.index.sparse_table, b.index.sparse_table));
  CHECK(same_bits(a.index.blocks, b.index.blocks));
  CHECK(same_bits(a.index.n_ctx, b.index.n_ctx));
  CHECK(same_bits(a.index.long_row, b.index.long_row));
  CHECK(same_bits(a.split.q8, b.split.q8));
  CHECK(same_bits(a.split.o, b.split.o));
  CHECK(same_bits(a.split.m, b.split.m));
  CHECK(same_bits(a.split.l, b.split.l));
  CHECK(same_bits(a.merge.attn, b.merge.attn));
  CHECK(same_bits(a.merge.attn8, b.merge.attn8));
  CHECK(same_bits(a.merge.x_scale, b.merge.x_scale));
  CHECK(same_bits(a.oproj.partial, b.oproj.partial));
  CHECK(same_bits(a.a, b.a));
  CHECK(same_bits(a.h_mid, b.h_mid));
  CHECK(same_bits(a.router.xn, b.router.xn));
  CHECK(same_bits(a.router.xn8, b.router.xn8));
  CHECK(same_bits(a.router.xsc, b.router.xsc));
  CHECK(same_bits(a.router.rstd, b.router.rstd));
  CHECK(same_bits(a.router.logit, b.router.logit));
  CHECK(same_bits(a.router.sig, b.router.sig));
  CHECK(same_bits(a.router.key, b.router.key));
  CHECK(same_bits(a.route.ids, b.route.ids));
  CHECK(same_bits(a.route.weights, b.route.weights));
  CHECK(same_bits(a.moe.gate, b.moe.gate));
  CHECK(same_bits(a.moe.up, b.moe.up));
  CHECK(same_bits(a.moe.mid, b.moe.mid));
  CHECK(same_bits(a.moe.mid8, b.moe.mid8));
  CHECK(same_bits(a.moe.midsc, b.moe.midsc));
  CHECK(same_bits(a.moe.partial, b.moe.partial));
  CHECK(same_bits(a.ar_out, b.ar_out));
}

void check_inputs_equal(const StepInputs& a, const StepInputs& b) {
  CHECK(a.shared.tokens == b.shared.tokens);
  CHECK(a.shared.q_len == b.shared.q_len);
  CHECK(a.shared.bt_width == b.shared.bt_width);
  CHECK(a.shared.score_width == b.shared.score_width);
  CHECK(same_bits(a.shared.seq_lens, b.shared.seq_lens));
  CHECK(same_bits(a.shared.block_table, b.shared.block_table));
  CHECK(same_bits(a.shared.h_in, b.shared.h_in));
  REQUIRE(a.ranks.size() == b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    CHECK(a.ranks[r].n_pages == b.ranks[r].n_pages);
    CHECK(same_bits(a.ranks[r].index_scores, b.ranks[r].index_scores));
    CHECK(same_bits(a.ranks[r].q, b.ranks[r].q));
    CHECK(same_bits(a.ranks[r].k_cache, b.ranks[r].k_cache));
    CHECK(same_bits(a.ranks[r].v_cache, b.ranks[r].v_cache));
    CHECK(same_bits(a.ranks[r].k_scale, b.ranks[r].k_scale));
    CHECK(same_bits(a.ranks[r].v_scale, b.ranks[r].v_scale));
  }
}

// Raw HDF5 surgery on a written file (to plant faults the writer never makes).
struct RawFile {
  hid_t f;
  explicit RawFile(const std::string& p) {
    h5::silence_errors();
    f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
  }
  ~RawFile() { H5Fclose(f); }
};

}  // namespace

TEST_SUITE("golden") {

TEST_CASE("golden round trip: every dataset reads back bit for bit (narrow S = 4)") {
  TempDir t;
  const Case& c = shared_case(4);
  // The test is not vacuous: the step produced real values.
  CHECK(any_nonzero(c.res.ranks[0].split.o));
  CHECK(any_nonzero(c.res.ranks[1].moe.partial));
  CHECK(any_nonzero(c.res.ranks[0].ar_out));
  CHECK(any_nonzero(c.in.ranks[0].k_cache));
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  golden::GoldenReader g(p);
  CHECK(g.tp() == c.cfg.tp);
  CHECK(g.tokens() == 4);
  CHECK(golden::config_to_json(g.config()) == golden::config_to_json(c.cfg));
  CHECK(g.root_attr("magic") == "K4GOLDEN");
  CHECK(g.root_attr("contract_version") == "1");
  CHECK(g.root_attr("scenario") == c.meta.scenario_json);
  check_inputs_equal(g.inputs(), c.in);
  const StepResult back = g.result();
  REQUIRE(back.ranks.size() == c.res.ranks.size());
  for (size_t r = 0; r < back.ranks.size(); ++r) check_rank_equal(back.ranks[r], c.res.ranks[r]);
  // Weights: the rank shards, and the stored experts equal the source's.
  const LayerWeights lw = g.weights();
  for (int r = 0; r < c.cfg.tp; ++r) {
    CHECK(same_bits(lw.ranks[r].w_o, c.w.ranks[r].w_o));
    CHECK(same_bits(lw.ranks[r].s_o, c.w.ranks[r].s_o));
    CHECK(same_bits(lw.ranks[r].g_post, c.w.ranks[r].g_post));
    CHECK(same_bits(lw.ranks[r].w_gate, c.w.ranks[r].w_gate));
    CHECK(same_bits(lw.ranks[r].bias, c.w.ranks[r].bias));
    const golden::MoeStage m = g.moe(r);
    CHECK(m.expert_ids.back() == c.cfg.shared_expert());
    for (int32_t e : m.expert_ids) {
      auto a = m.experts->expert(r, e);
      auto b = c.w.experts->expert(r, e);
      CHECK(same_bits(a->w13, b->w13));
      CHECK(same_bits(a->s13, b->s13));
      CHECK(same_bits(a->w2, b->w2));
      CHECK(same_bits(a->s2, b->s2));
    }
    // an expert nobody routed to is not there
    int absent = -1;
    for (int e = 0; e < c.cfg.n_routed && absent < 0; ++e)
      if (!std::binary_search(m.expert_ids.begin(), m.expert_ids.end(), e)) absent = e;
    if (absent >= 0) CHECK_THROWS_WITH_AS(m.experts->expert(r, absent), doctest::Contains("is not stored"), std::invalid_argument);
  }
  // The whole step replays from the file alone: its weights and inputs give the same result.
  const StepResult replay = run_step(lw, g.inputs());
  for (size_t r = 0; r < replay.ranks.size(); ++r) check_rank_equal(replay.ranks[r], c.res.ranks[r]);
}

TEST_CASE("golden stage readers return each stage's inputs; replaying a stage on them gives its outputs") {
  TempDir t;
  const Case& c = shared_case(5, "3000");  // wide MoE from S = 5
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  golden::GoldenReader g(p);
  const Config& cfg = g.config();
  for (int r = 0; r < cfg.tp; ++r) {
    const golden::IndexStage s0 = g.index(r);
    IndexOut i0;
    select_blocks(i0, s0.in, s0.index_scores, cfg);
    CHECK(same_bits(s0.index_scores, c.in.ranks[size_t(r)].index_scores));  // the rank's own
    CHECK(same_bits(i0.sparse_table, s0.out.sparse_table));
    const golden::SplitStage s1 = g.split(r);
    SplitOut o1;
    split_attention(o1, s1.shared, s1.rank, s1.index, cfg);
    CHECK(same_bits(o1.o, s1.out.o));
    CHECK(same_bits(o1.m, s1.out.m));
    const golden::MergeStage s2 = g.merge(r);
    MergeOut o2;
    merge_partitions(o2, s2.in, s2.tokens, cfg);
    CHECK(same_bits(o2.attn8, s2.out.attn8));
    const golden::OprojStage s3 = g.oproj(r);
    OprojOut o3;
    o_proj_partials(o3, s3.in, s3.w, s3.tokens, cfg);
    CHECK(same_bits(o3.partial, s3.out.partial));
    CHECK(s3.rank_partials.size() == size_t(cfg.tp));
    const golden::RouterStage s4 = g.router(r);
    RouterOut o4;
    route_scores(o4, s4.a, s4.h_in, s4.w, s4.tokens, cfg);
    CHECK(same_bits(o4.key, s4.out.key));
    const golden::MoeStage s5 = g.moe(r);
    RouteOut rt;
    route_top4(rt, s5.in, s5.tokens, cfg);
    CHECK(same_bits(rt.ids, s5.route.ids));
    MoeOut o5;
    experts_up_gate(o5, rt, s5.in, *s5.experts, r, s5.tokens, cfg);
    experts_down(o5, rt, *s5.experts, r, s5.tokens, cfg);
    CHECK(same_bits(o5.partial, s5.out.partial));
  }
}

TEST_CASE("golden selected KV form: only the selected pages are stored, and the split replays on them") {
  TempDir t;
  Case c = make_case(3, "long");  // a long context: the selection is a small part of the cache
  c.meta.kv_form = "selected";
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  golden::GoldenReader g(p);
  for (int r = 0; r < c.cfg.tp; ++r) {
    const golden::SplitStage s = g.split(r);
    CHECK(s.rank.n_pages == c.in.ranks[r].n_pages);
    SplitOut o;
    split_attention(o, s.shared, s.rank, s.index, c.cfg);
    CHECK(same_bits(o.o, c.res.ranks[r].split.o));
    CHECK(same_bits(o.l, c.res.ranks[r].split.l));
  }
  {
    h5::File f(p, h5::File::Mode::ReadOnly);
    h5::Dataset ids = f.root().open_dataset("/rank0/split/inputs/page_ids");
    CHECK(ids.size() < uint64_t(c.in.ranks[0].n_pages));
    CHECK(f.root().open_group("/rank0/split/inputs").attr_string("kv_form") == "selected");
  }
}

TEST_CASE("golden refuses to overwrite unless asked") {
  TempDir t;
  const Case& c = shared_case(1);
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  CHECK_THROWS_WITH_AS(golden::write_golden(p, c.w, c.in, c.res, c.meta, {}), doctest::Contains("exists"),
                       std::invalid_argument);
  golden::WriteOptions o;
  o.overwrite = true;
  CHECK_NOTHROW(golden::write_golden(p, c.w, c.in, c.res, c.meta, o));
  CHECK(t.entries() == 1);
}

TEST_CASE("golden failure leaves neither the output nor a temporary") {
  TempDir t;
  Case c = make_case(2);
  c.res.ranks[2].moe.partial.pop_back();  // a late dataset of the wrong size: fails mid-file
  const std::string p = t.path("g.h5");
  CHECK_THROWS_WITH_AS(golden::write_golden(p, c.w, c.in, c.res, c.meta, {}),
                       doctest::Contains("/rank2/moe/outputs/partial"), std::invalid_argument);
  CHECK(!fs::exists(p));
  CHECK(t.entries() == 0);
}

TEST_CASE("golden schema version mismatch names the versions and the fix") {
  TempDir t;
  const Case& c = shared_case(1);
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  {
    h5::File f(p, h5::File::Mode::ReadWrite);
    f.root().set_attr("schema_version", int64_t(3));
  }
  CHECK_THROWS_WITH_AS(golden::GoldenReader{p},
                       ("golden " + p + " was written by schema version 3; this tool reads versions 1..2; regenerate with `k4 golden ...`").c_str(),
                       golden::FormatError);
}

TEST_CASE("golden validation names the file, the dataset and what was expected") {
  TempDir t;
  const Case& c = shared_case(2);
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  const std::string q = t.path("q.h5");
  auto fresh = [&] { fs::copy_file(p, q, fs::copy_options::overwrite_existing); };

  SUBCASE("missing dataset") {
    fresh();
    { RawFile f(q); H5Ldelete(f.f, "/rank1/router/outputs/sig", H5P_DEFAULT); }
    CHECK_THROWS_WITH_AS(golden::GoldenReader{q},
                         doctest::Contains("dataset /rank1/router/outputs/sig is missing (expected dtype f32, shape (2,32)"),
                         golden::FormatError);
  }
  SUBCASE("wrong dtype attribute") {
    fresh();
    {
      h5::File f(q, h5::File::Mode::ReadWrite);
      f.root().open_dataset("/rank0/split/outputs/o").set_attr("dtype", "f32");
    }
    CHECK_THROWS_WITH_AS(golden::GoldenReader{q},
                         doctest::Contains(("golden " + q + ": dataset /rank0/split/outputs/o has dtype f32, expected bf16").c_str()),
                         golden::FormatError);
  }
  SUBCASE("wrong shape") {
    fresh();
    { RawFile f(q); H5Ldelete(f.f, "/rank3/merge/outputs/x_scale", H5P_DEFAULT); }
    {
      h5::File hf(q, h5::File::Mode::ReadWrite);
      std::vector<uint32_t> v(3, 0);
      h5::Dataset d = hf.root().open_group("/rank3/merge/outputs").write<uint32_t>("x_scale", {3}, v.data());
      d.set_attr("dtype", "f32");
    }
    CHECK_THROWS_WITH_AS(golden::GoldenReader{q},
                         doctest::Contains("dataset /rank3/merge/outputs/x_scale has shape (3), expected dtype f32, shape (2) (token)"),
                         golden::FormatError);
  }
  SUBCASE("dangling link") {
    fresh();
    { RawFile f(q); H5Ldelete(f.f, "/rank0/index/outputs/n_ctx", H5P_DEFAULT); }
    // /rank0/index/outputs/n_ctx is checked first and reported as missing; its link in split is dangling too
    CHECK_THROWS_WITH_AS(golden::GoldenReader{q}, doctest::Contains("/rank0/index/outputs/n_ctx is missing"),
                         golden::FormatError);
  }
  SUBCASE("not a golden") {
    fresh();
    { h5::File f(q, h5::File::Mode::ReadWrite); f.root().set_attr("magic", "NOPE"); }
    CHECK_THROWS_WITH_AS(golden::GoldenReader{q}, doctest::Contains("not a K4 golden (magic 'NOPE', expected 'K4GOLDEN')"),
                         golden::FormatError);
  }
  SUBCASE("not HDF5") {
    { std::ofstream f(q, std::ios::binary | std::ios::trunc); f << "plain text"; }
    CHECK_THROWS_WITH_AS(golden::GoldenReader{q}, doctest::Contains("cannot be opened as HDF5"), golden::FormatError);
  }
}

TEST_CASE("golden: a planted one-bit error in a stored tensor is seen by the reader") {
  TempDir t;
  const Case& c = shared_case(2);
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  {
    h5::File f(p, h5::File::Mode::ReadWrite);
    h5::Dataset d = f.root().open_dataset("/rank1/moe/outputs/mid");
    std::vector<uint16_t> v = d.read<uint16_t>();
    v[17] ^= 1u;
    d.write_raw(v.data(), h5::Elem::U16);
  }
  golden::GoldenReader g(p);
  CHECK(!same_bits(g.rank_result(1).moe.mid, c.res.ranks[1].moe.mid));
  CHECK(same_bits(g.rank_result(0).moe.mid, c.res.ranks[0].moe.mid));
}

TEST_CASE("golden: the same inputs give a byte-identical file with 1 and 2 threads") {
  TempDir t;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  Case a = make_case(6, "medium", 11);
  golden::write_golden(t.path("a.h5"), a.w, a.in, a.res, a.meta, {});
  omp_set_num_threads(2);
  Case b = make_case(6, "medium", 11);
  golden::write_golden(t.path("b.h5"), b.w, b.in, b.res, b.meta, {});
  omp_set_num_threads(before);
  const std::string x = read_bytes(t.path("a.h5")), y = read_bytes(t.path("b.h5"));
  CHECK(x.size() > 100000);
  CHECK(x == y);
}

TEST_CASE("golden: h5dump reads the file's header") {
  if (std::system("command -v h5dump > /dev/null 2>&1") != 0) {
    MESSAGE("h5dump not installed (apt-get install hdf5-tools): skipped");
    return;
  }
  TempDir t;
  const Case& c = shared_case(1);
  const std::string p = t.path("g.h5"), out = t.path("dump.txt");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  CHECK(std::system(("h5dump -H " + p + " > " + out + " 2>&1").c_str()) == 0);
  const std::string d = read_bytes(out);
  CHECK(d.find("ATTRIBUTE \"magic\"") != std::string::npos);
  CHECK(d.find("LINKTARGET \"/rank0/split/outputs/o\"") != std::string::npos);
  CHECK(d.find("H5T_STD_U16LE") != std::string::npos);
  CHECK(std::system(("h5dump -a /magic " + p + " > " + out + " 2>&1").c_str()) == 0);
  CHECK(read_bytes(out).find("\"K4GOLDEN\"") != std::string::npos);
}

TEST_CASE("golden inputs file: write and read back; a golden's inputs read the same way") {
  TempDir t;
  const Case& c = shared_case(3);
  const std::string p = t.path("in.h5");
  golden::write_inputs_file(p, c.cfg, c.in, false);
  Config cfg;
  check_inputs_equal(golden::read_inputs_file(p, &cfg), c.in);
  CHECK(golden::config_to_json(cfg) == golden::config_to_json(c.cfg));
  const std::string g = t.path("g.h5");
  golden::write_golden(g, c.w, c.in, c.res, c.meta, {});
  check_inputs_equal(golden::read_inputs_file(g), c.in);
  CHECK_THROWS_WITH_AS(golden::GoldenReader{p}, doctest::Contains("is an inputs file"), golden::FormatError);
}

TEST_CASE("golden schema table: every stage output has its own result field, of its dtype's element type") {
  // Each output row names a distinct RankResult vector (a copied row pointing at its
  // neighbour's field would write one tensor twice); no input row has a field of its own, and
  // a linked stage input reads the field of the output it links to.
  RankResult R;
  std::set<const void*> seen;
  int outputs = 0;
  for (const golden::TensorSpec& s : golden::tensor_specs()) {
    INFO(s.group << "/" << s.name);
    const bool output = std::string(s.group).find("/outputs") != std::string::npos;
    CHECK((s.field != nullptr) == output);
    if (!output) continue;
    ++outputs;
    const void* addr = nullptr;
    CHECK_NOTHROW(golden::with_field(s, R, [&](auto& v) {
      addr = &v;
      CHECK(sizeof(v[0]) == golden::dtype_bytes(s.dtype));
    }));
    CHECK(seen.insert(addr).second);
  }
  CHECK(outputs == 30);
  const golden::TensorSpec* q8 = golden::result_spec(golden::find_spec("merge/inputs", "q8"));
  REQUIRE(q8 != nullptr);
  CHECK(std::string(q8->group) == "split/outputs");
  CHECK(golden::result_spec(golden::find_spec("oproj/inputs", "w_o")) == nullptr);
  CHECK(golden::result_spec(golden::find_spec("oproj/inputs", "h_in")) == nullptr);
  // a row whose field is of another element type is refused
  golden::TensorSpec wrong = golden::find_spec("split/outputs", "o");
  wrong.dtype = golden::DType::F32;
  CHECK_THROWS_AS(golden::with_field(wrong, R, [](auto&) {}), std::logic_error);
}

TEST_CASE("golden config JSON: every field round trips; missing and unknown fields are errors") {
  Config c = preset("small", 2);
  c.variant.kv_scale = KvScale::scalar;
  c.kv_page_stride = 8;
  const std::string j = golden::config_to_json(c);
  CHECK(golden::config_to_json(golden::config_from_json(j, "t")) == j);
  std::string missing = j;
  missing.replace(missing.find("\"eps\""), 5, "\"epz\"");
  CHECK_THROWS_WITH_AS(golden::config_from_json(missing, "t"), doctest::Contains("lacks field 'eps'"), golden::FormatError);
}


// ---- per-rank index scores (schema version 2; docs/numerics.md R0.0) ----------------------

TEST_CASE("per-rank index scores: each rank stores its own, and selects from its own") {
  TempDir t;
  const Case& c = shared_case(3, "5000");  // 40 blocks: scored rows
  REQUIRE(c.cfg.tp > 1);
  // the synthetic default: every rank its own scores
  for (int r = 1; r < c.cfg.tp; ++r) CHECK(!same_bits(c.in.ranks[size_t(r)].index_scores, c.in.ranks[0].index_scores));
  const std::string p = t.path("g.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  golden::GoldenReader g(p);
  int differ = 0;
  for (int r = 0; r < c.cfg.tp; ++r) {
    const golden::IndexStage s = g.index(r);
    CHECK(same_bits(s.index_scores, c.in.ranks[size_t(r)].index_scores));
    // the model's selection of rank r is select_blocks on rank r's scores
    IndexOut o;
    select_blocks(o, s.in, s.index_scores, c.cfg);
    CHECK(same_bits(o.blocks, c.res.ranks[size_t(r)].index.blocks));
    differ += r > 0 && !same_bits(c.res.ranks[size_t(r)].index.blocks, c.res.ranks[0].index.blocks);
  }
  CHECK(differ > 0);  // ranks select different blocks
  h5::File f(p, h5::File::Mode::ReadOnly);
  CHECK(!f.root().exists("/inputs/index_scores"));
  CHECK(f.root().soft_target("/rank1/index/inputs/index_scores").empty());  // stored, not linked
}

TEST_CASE("per-rank index scores: rank_scores shared links ranks to rank 0, distinct selects a different set a rank") {
  Config cfg = preset("tiny");
  const LayerWeights w = synth::synthetic_layer(cfg, 7);
  Scenario s;
  s.tokens = 2;
  s.context = {"5000"};
  s.rank_scores = "shared";
  const StepInputs shared = make_inputs(cfg, s, 3, &w);
  s.rank_scores = "own";
  const StepInputs own = make_inputs(cfg, s, 3, &w);
  s.rank_scores = "distinct";
  const StepInputs distinct = make_inputs(cfg, s, 3, &w);
  CHECK(same_bits(shared.ranks[0].index_scores, own.ranks[0].index_scores));  // rank 0: one stream
  const StepResult rd = run_step(w, distinct);
  for (int r = 0; r < cfg.tp; ++r) {
    CHECK(same_bits(shared.ranks[size_t(r)].index_scores, shared.ranks[0].index_scores));
    for (int q = r + 1; q < cfg.tp; ++q)
      for (int k = 0; k < 2; ++k) {
        const auto a = rd.ranks[size_t(r)].index.blocks.begin() + k * cfg.topk_blocks;
        const auto b = rd.ranks[size_t(q)].index.blocks.begin() + k * cfg.topk_blocks;
        CHECK_MESSAGE(!std::equal(a, a + cfg.topk_blocks, b), "ranks " << r << ", " << q << " row " << k);
      }
  }
  TempDir t;
  const std::string p = t.path("g.h5");
  golden::GoldenMeta meta;
  golden::write_golden(p, w, shared, run_step(w, shared), meta, {});
  h5::File f(p, h5::File::Mode::ReadOnly);
  CHECK(f.root().soft_target("/rank1/index/inputs/index_scores") == "/rank0/index/inputs/index_scores");
  const StepInputs back = golden::GoldenReader(p).inputs();
  for (int r = 0; r < cfg.tp; ++r) CHECK(same_bits(back.ranks[size_t(r)].index_scores, shared.ranks[0].index_scores));
}

// A schema version 1 golden: one /inputs/index_scores, every rank's a link to it.
void make_version1(const std::string& p) {
  h5::File f(p, h5::File::Mode::ReadWrite);
  const h5::Group root = f.root();
  const int tp = int(root.attr_int("tp"));
  h5::Dataset r0 = root.open_dataset("/rank0/index/inputs/index_scores");
  std::vector<uint32_t> v(r0.size());
  r0.read_raw(v.data(), h5::Elem::U32);
  const std::vector<uint64_t> shape = r0.shape();
  h5::Dataset d = root.open_group("inputs").create_dataset("index_scores", h5::Elem::U32, shape);
  d.write_raw(v.data(), h5::Elem::U32);
  d.set_attr("dtype", "f32");
  for (int r = 0; r < tp; ++r) {
    const std::string g = "/rank" + std::to_string(r) + "/index/inputs";
    REQUIRE(H5Ldelete(root.id(), (g + "/index_scores").c_str(), H5P_DEFAULT) >= 0);
    root.open_group(g).link_soft("index_scores", "/inputs/index_scores");
  }
  root.set_attr("schema_version", int64_t(1));
}

TEST_CASE("a schema version 1 golden is read as it was made: every rank with the one /inputs/index_scores") {
  TempDir t;
  const Case& c = shared_case(3, "5000");
  const std::string p = t.path("v1.h5");
  golden::write_golden(p, c.w, c.in, c.res, c.meta, {});
  make_version1(p);
  golden::GoldenReader g(p);
  const StepInputs in = g.inputs();
  for (int r = 0; r < c.cfg.tp; ++r) {
    CHECK(same_bits(in.ranks[size_t(r)].index_scores, c.in.ranks[0].index_scores));
    CHECK(same_bits(g.index(r).index_scores, c.in.ranks[0].index_scores));
  }
  // rank 0's outputs are those of its scores; read_inputs_file reads the golden the same way
  const StepInputs in2 = golden::read_inputs_file(p);
  CHECK(same_bits(in2.ranks[1].index_scores, c.in.ranks[0].index_scores));
}

TEST_CASE("inputs files carry each rank's own index scores; a version 1 file's shared scores are every rank's") {
  TempDir t;
  const Case& c = shared_case(3, "5000");
  const std::string p = t.path("i.h5");
  golden::write_inputs_file(p, c.cfg, c.in, false);
  const StepInputs back = golden::read_inputs_file(p);
  for (int r = 0; r < c.cfg.tp; ++r) CHECK(same_bits(back.ranks[size_t(r)].index_scores, c.in.ranks[size_t(r)].index_scores));
  {  // version 1: /inputs/index_scores, nothing under the ranks
    h5::File f(p, h5::File::Mode::ReadWrite);
    const h5::Group root = f.root();
    h5::Dataset d = root.open_group("inputs").create_dataset("index_scores", h5::Elem::U32,
                                                            {uint64_t(c.in.shared.tokens), uint64_t(c.in.shared.score_width)});
    d.write_raw(c.in.ranks[0].index_scores.data(), h5::Elem::U32);
    d.set_attr("dtype", "f32");
    for (int r = 0; r < c.cfg.tp; ++r)
      REQUIRE(H5Ldelete(root.id(), ("/rank" + std::to_string(r) + "/inputs/index_scores").c_str(), H5P_DEFAULT) >= 0);
    root.set_attr("schema_version", int64_t(1));
  }
  const StepInputs v1 = golden::read_inputs_file(p);
  for (int r = 0; r < c.cfg.tp; ++r) CHECK(same_bits(v1.ranks[size_t(r)].index_scores, c.in.ranks[0].index_scores));
}

}  // TEST_SUITE golden
