// test_fuzz_regressions.cpp -- every finding of the fuzz targets (tests/fuzz, scripts/fuzz.sh),
// fed again through the entry point that failed, with the error message it now gives.
//
// Golden / dump findings come twice: as the fuzzer's own input (an edit program of
// tests/fuzz/golden_edits.hpp, checked in under tests/fuzz/regressions/golden_reader/ and
// replayed on the same small bases the fuzzer uses), and as the same damage made explicitly
// through the HDF5 API (robust to a change of the bases). Every checked-in program is also
// run through all the readers the fuzzer runs, with findings thrown (fuzz::Finding) instead
// of aborting. safetensors / scenario findings are inline bytes.
// docs/reliability.md ("Fuzzing") lists the findings and their fixes.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "golden/diff/compare.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "tests/cpu/cli_run.hpp"
#include "tests/fuzz/golden_edits.hpp"

namespace fs = std::filesystem;
using namespace k4;

namespace {

using k4::cli::source_root;
fs::path regressions(const std::string& target) { return source_root() / "tests" / "fuzz" / "regressions" / target; }

// The fuzzer's bases, made once for the whole suite in a directory removed at exit.
struct Bases {
  fs::path dir;
  fuzz::World world;
  Bases() {
    dir = fs::temp_directory_path() / ("k4_test_fuzz_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    world = fuzz::make_world(dir.string());
  }
  ~Bases() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // A fresh copy of base b.
  std::string copy(size_t b, const std::string& name) const {
    const std::string p = (dir / name).string();
    fs::copy_file(world.bases.at(b).path, p, fs::copy_options::overwrite_existing);
    return p;
  }
  // A copy of the base the program names, with the program's edits applied; flags out.
  std::string replay(const fs::path& program, const std::string& name, size_t* base = nullptr,
                     uint8_t* flags = nullptr) const {
    const std::string bytes = fuzz::read_file(program.string());
    fuzz::Bytes b(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const size_t i = b.u8() % world.bases.size();
    const uint8_t f = b.u8();
    const std::string p = copy(i, name);
    fuzz::apply_edits(p, world.bases[i], b);
    if (base) *base = i;
    if (flags) *flags = f;
    return p;
  }
};

const Bases& bases() {
  static const Bases b;
  return b;
}

// Edits through the C API, as a damaged file would hold them.
struct H5Edit {
  hid_t f;
  explicit H5Edit(const std::string& path) : f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) { REQUIRE(f >= 0); }
  ~H5Edit() { H5Fclose(f); }
  void int_array_attr(const char* obj, const char* name, std::vector<int64_t> v) const {
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    H5Adelete(o, name);
    const hsize_t n = v.size();
    hid_t s = H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(o, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, v.data());
    H5Aclose(a);
    H5Sclose(s);
    H5Oclose(o);
  }
  void external(const char* link, const std::string& file, const char* obj) const {
    H5Ldelete(f, link, H5P_DEFAULT);
    REQUIRE(H5Lcreate_external(file.c_str(), obj, f, link, H5P_DEFAULT, H5P_DEFAULT) >= 0);
  }
  void soft(const char* link, const char* target) const {
    H5Ldelete(f, link, H5P_DEFAULT);
    REQUIRE(H5Lcreate_soft(target, f, link, H5P_DEFAULT, H5P_DEFAULT) >= 0);
  }
  void string_array_attr(const char* obj, const char* name, const std::string& each, hsize_t n) const {
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    H5Adelete(o, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, each.size());
    hid_t s = H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(o, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    std::string buf;
    for (hsize_t i = 0; i < n; ++i) buf += each;
    H5Awrite(a, t, buf.data());
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
    H5Oclose(o);
  }
};

}  // namespace

TEST_SUITE("fuzz_regressions") {

TEST_CASE("fuzz regression: every checked-in golden_reader input runs through all readers without a finding") {
  fuzz::findings_throw() = true;
  const fs::path dir = regressions("golden_reader");
  REQUIRE(fs::is_directory(dir));
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    CAPTURE(e.path().filename().string());
    // every deep read, replay on and off, not only the one the fuzzer's flags took
    for (uint8_t flags = 0; flags < 8; ++flags) {
      size_t b = 0;
      const std::string q = bases().replay(e.path(), "replayed.h5", &b);
      try {
        fuzz::exercise(bases().world.bases[b], q, flags);
      } catch (const fuzz::Finding& f) {
        FAIL_CHECK(f.what);
      }
    }
    ++n;
  }
  CHECK(n > 0);
  fuzz::findings_throw() = false;
}

TEST_CASE("fuzz regression: a scalar attribute stored as an array is refused, not read past (was a stack overflow)") {
  // Found: golden_reader, seed corpus (attribute kinds): /@tp as an int64 array of 2; H5Aread
  // wrote 16 bytes into attr_int's one int64 (ASan stack-buffer-overflow in H5A__read). A
  // fixed-length string array (attr_string) overflowed the heap the same way.
  const std::string prog = bases().replay(regressions("golden_reader") / "attr_array_tp", "attr_array_tp.h5");
  CHECK_THROWS_WITH_AS(golden::GoldenReader{prog}, doctest::Contains("attribute tp: holds 2 values, expected one (a scalar)"),
                       golden::FormatError);

  const std::string p = bases().copy(0, "array_attrs.h5");
  H5Edit(p).int_array_attr("/", "tokens", {2, 2, 2});
  CHECK_THROWS_WITH_AS(golden::GoldenReader{p}, doctest::Contains("/ attribute tokens: holds 3 values, expected one (a scalar)"),
                       golden::FormatError);
  const std::string q = bases().copy(0, "array_magic.h5");
  H5Edit(q).string_array_attr("/", "magic", "K4GOLDEN", 4);
  CHECK_THROWS_WITH_AS(golden::GoldenReader{q}, doctest::Contains("attribute magic: holds 4 values, expected one (a scalar)"),
                       golden::FormatError);
  golden::DiffOptions opt;
  CHECK_THROWS_WITH_AS(golden::diff_files(bases().world.bases[0].pristine_golden, q, opt),
                       doctest::Contains("attribute magic: holds 4 values, expected one (a scalar)"), golden::FormatError);
}

TEST_CASE("fuzz regression: external links are refused with the link named (was a timeout)") {
  // Found: golden_reader, 600 s run 1 (timeout after 12 s): a dump whose /rank1 was an external
  // link into the golden's /rank1; every read reopened the golden through the link.
  const std::string golden = bases().world.bases[1].pristine_golden;
  const std::string prog = bases().replay(regressions("golden_reader") / "external_link_rank", "external_link_rank.h5");
  golden::DiffOptions opt;
  const std::string want = "link /rank1: is an external link to " + golden + ":/rank1; goldens and dumps hold hard and soft links only";
  CHECK_THROWS_WITH_AS(golden::diff_files(golden, prog, opt), doctest::Contains(want.c_str()), golden::FormatError);
  // A dump's stage group, and a golden's soft link that leads through an external link.
  const std::string d = bases().copy(2, "external_stage.h5");
  H5Edit(d).external("/rank0/index", bases().world.bases[0].pristine_golden, "/rank0/index");
  CHECK_THROWS_WITH_AS(golden::diff_files(bases().world.bases[0].pristine_golden, d, opt),
                       doctest::Contains("link /rank0/index: is an external link to"), golden::FormatError);
  const std::string g = bases().copy(0, "external_behind_soft.h5");
  {
    H5Edit e(g);
    e.soft("/rank0/merge/inputs/o", "/elsewhere/o");
    e.external("/elsewhere", bases().world.bases[0].pristine_golden, "/rank0/split/outputs");
  }
  CHECK_THROWS_WITH_AS(golden::GoldenReader{g}, doctest::Contains("link /elsewhere: is an external link to"),
                       golden::FormatError);
}

TEST_CASE("fuzz regression: a pad row in a long request is a scenario error (was inputs the model refuses)") {
  // Found: scenario, 600 s run 1: validate_scenario accepted a pad row inside a request of
  // q_len 2 whose context is long; make_inputs then drew a 1-block row on the long path, which
  // validate_inputs (and run_step) refuse ("a long request's row of 1 blocks leaves a share
  // with fewer than TOPK_BLOCKS blocks").
  const Config cfg = preset("tiny");
  const std::string text = fuzz::read_file((regressions("scenario") / "pad_row_in_long_request").string());
  const Scenario s = scenario_from_json(text, "fuzz");
  CHECK_THROWS_WITH_AS(validate_scenario(s, cfg),
                       doctest::Contains("request 1 (rows 2..3) mixes long and not-long rows: row 2 (a pad row) is not "
                                         "long, its last row 3 (context 'long') is long"),
                       std::invalid_argument);
  CHECK_THROWS_AS(make_inputs(cfg, s, 1), std::invalid_argument);
  // One context a row: a short row in a long request, and the other way round.
  CHECK_THROWS_WITH_AS(validate_scenario(scenario_from_json(R"({"tokens": 2, "q_len": 2, "context": ["short", "long"]})", "t"), cfg),
                       doctest::Contains("row 0 (context 'short') is not long, its last row 1 (context 'long') is long"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(validate_scenario(scenario_from_json(R"({"tokens": 2, "q_len": 2, "context": [70000, 100]})", "t"), cfg),
                       doctest::Contains("row 0 (context '70000') is long, its last row 1 (context '100') is not long"),
                       std::invalid_argument);
  // Still fine: a pad row in a short request, rows all long, pad rows with q_len 1.
  for (const char* ok : {R"({"tokens": 4, "q_len": 2, "context": ["short", "long"], "pad_rows": [0]})",
                         R"({"tokens": 2, "q_len": 2, "context": ["long", "max"]})",
                         R"({"tokens": 3, "context": "long", "pad_rows": [1]})"}) {
    CAPTURE(ok);
    const Scenario v = scenario_from_json(ok, "t");
    CHECK_NOTHROW(validate_scenario(v, cfg));
    CHECK_NOTHROW(validate_inputs(make_inputs(preset("tiny", 1), v, 1), preset("tiny", 1)));
  }
}

TEST_CASE("fuzz regression: a config int field given as 1e20 is refused (was a float-to-int overflow)") {
  // Found: scenario, 600 s run 2 (UBSan float-cast-overflow in nlohmann's from_json):
  // "topk_blocks": 192233720368547758076 parses as a double; get_to(int) converted it.
  const std::string text = fuzz::read_file((regressions("scenario") / "config_int_field_1e20").string());
  const std::string cfg_text = text.substr(text.find('\0') + 1);
  CHECK_THROWS_WITH_AS(golden::config_from_json(cfg_text, "fuzz config"),
                       doctest::Contains("fuzz config: config field 'topk_blocks' is 1.9223372036854776e+20, expected an integer"),
                       golden::FormatError);
  const std::string tiny = golden::config_to_json(preset("tiny"));
  auto with = [&](const std::string& field, const std::string& value) {
    std::string t = tiny;
    const size_t at = t.find("\"" + field + "\":");
    REQUIRE(at != std::string::npos);
    const size_t v0 = at + field.size() + 3, v1 = t.find_first_of(",}", v0);
    return t.replace(v0, v1 - v0, value);
  };
  CHECK_NOTHROW(golden::config_from_json(tiny, "c"));
  CHECK_THROWS_WITH_AS(golden::config_from_json(with("hidden", "2048.5"), "c"),
                       "c: config field 'hidden' is 2048.5, expected an integer", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(with("hidden", "4294969344"), "c"),
                       "c: config field 'hidden' is 4294969344, expected an integer in the int range", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(with("eps", "1e300"), "c"),
                       "c: config field 'eps' is 1e+300, expected a finite number in the float range", golden::FormatError);
  const std::string no_variant = tiny.substr(0, tiny.find("\"variant\":"));
  CHECK_THROWS_WITH_AS(golden::config_from_json(no_variant + "\"variant\":1}", "c"),
                       "c: config field 'variant' is 1, expected an object of variant switches", golden::FormatError);
  auto with_switch = [&](const std::string& from, const std::string& to) {
    std::string t = tiny;
    REQUIRE(t.find(from) != std::string::npos);
    return t.replace(t.find(from), from.size(), to);
  };
  CHECK_THROWS_WITH_AS(golden::config_from_json(with_switch("\"router.gate\":\"bf16\"", "\"router.gate\":\"fp16\""), "c"),
                       "c: config variant switch router.gate: unknown value 'fp16' (values: bf16, f32)", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(with_switch("\"router.gate\":\"bf16\"", "\"router.gate\":true"), "c"),
                       "c: config field 'router.gate' is true, expected a string", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(with_switch("\"router.gate\":\"bf16\",", ""), "c"),
                       "c: config variant lacks switch 'router.gate'", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(with_switch("\"router.gate\":", "\"router.gate\":\"bf16\",\"moe.tp\":"), "c"),
                       "c: config variant has switch 'moe.tp' this tool does not know", golden::FormatError);
  // a schema version 1 config has static_kv_scale instead of the variant: the seed's build
  const std::string v1 = no_variant + "\"static_kv_scale\":true}";
  CHECK(golden::config_from_json(v1, "c").variant.kv_scale == KvScale::scalar);
  CHECK(golden::config_from_json(no_variant + "\"static_kv_scale\":false}", "c").variant == Variant{});
  CHECK_THROWS_WITH_AS(golden::config_from_json(no_variant + "\"static_kv_scale\":1}", "c"),
                       "c: config field 'static_kv_scale' is 1, expected true or false", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(tiny.substr(0, tiny.size() - 1) + ",\"static_kv_scale\":true}", "c"),
                       "c: config has field 'static_kv_scale' this tool does not know", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(no_variant.substr(0, no_variant.size() - 1) + "}", "c"),
                       "c: config lacks field 'variant'", golden::FormatError);
  CHECK_THROWS_WITH_AS(golden::config_from_json(with("name", "7"), "c"), "c: config field 'name' is 7, expected a string",
                       golden::FormatError);
  CHECK(golden::config_from_json(with("eps", "1"), "c").eps == 1.0f);  // an integer is a number
}

TEST_CASE("fuzz regression: a dump's non-UTF-8 soft-link target gives a JSON report (was a JSON library exception)") {
  // Found: golden_reader, 600 s run 2: a soft link /rank0/oproj/outputs/a -> "\x81\x81..."
  // made the report's 'why' text invalid UTF-8; report_json's dump() threw type_error 316
  // (k4 diff --json failed).
  golden::DiffOptions opt;
  const std::string golden = bases().world.bases[0].pristine_golden;
  const std::string prog = bases().replay(regressions("golden_reader") / "soft_link_not_utf8", "soft_link_not_utf8.h5");
  const golden::DiffReport r1 = golden::diff_files(golden, prog, opt);
  CHECK_NOTHROW(golden::report_json(r1));
  const std::string d = bases().copy(2, "soft_not_utf8.h5");
  H5Edit(d).soft("/rank0/oproj/outputs/a", "/\x81\xfe/a");
  const golden::DiffReport r2 = golden::diff_files(golden, d, opt);
  std::string json;
  REQUIRE_NOTHROW(json = golden::report_json(r2));
  CHECK(json.find("a soft link to /\xEF\xBF\xBD\xEF\xBF\xBD/a, which is not in the dump") != std::string::npos);
  CHECK(golden::report_text(r2).find("oproj/outputs/a") != std::string::npos);
}

TEST_CASE("fuzz regression: config counts that are zero or huge are refused before validate divides by them") {
  // Found: golden_reader, 600 s run 3 (UBSan division by zero, reference/config.cpp): a golden
  // whose config JSON said ug_rows = 0; validate() computed inter % (2 * ug_rows). n_split = 0,
  // n_routed = top_k = 0 divided by zero the same way, and topk_blocks * sparse_block or
  // init_blocks + local_blocks could overflow an int.
  const std::string prog = bases().replay(regressions("golden_reader") / "config_ug_rows_zero", "config_ug_rows_zero.h5");
  CHECK_THROWS_WITH_AS(golden::GoldenReader{prog}, doctest::Contains("config 'tiny': ug_rows = 0 is outside 1..32768"),
                       golden::FormatError);
  struct Case {
    void (*set)(Config&);
    const char* message;
  };
  const Case cases[] = {
      {[](Config& c) { c.ug_rows = 0; }, "config 'tiny': ug_rows = 0 is outside 1..32768"},
      {[](Config& c) { c.n_split = 0; }, "config 'tiny': n_split = 0 is outside 1..32768"},
      {[](Config& c) { c.n_routed = 0, c.top_k = 0; }, "config 'tiny': n_routed = 0 is outside 1..32768"},
      {[](Config& c) { c.topk_blocks = 1 << 20, c.sparse_block = 1 << 12; }, "config 'tiny': topk_blocks = 1048576 is outside 1..32768"},
      {[](Config& c) { c.init_blocks = 2147483647; }, "config 'tiny': init_blocks = 2147483647 is outside 0..32768"},
      {[](Config& c) { c.max_context = -128; }, "config 'tiny': max_context = -128 is outside 1..2^30"},
      {[](Config& c) { c.inter = 1 << 30; }, "config 'tiny': inter = 1073741824 is outside 1..32768"},
  };
  for (const Case& k : cases) {
    Config c = preset("tiny");
    k.set(c);
    CHECK_THROWS_WITH_AS(c.validate(), k.message, std::invalid_argument);
  }
  for (const std::string& p : preset_names()) CHECK_NOTHROW(preset(p).validate());
}

TEST_CASE("fuzz regression: replay checks a dump's index inputs before select_blocks reads by them (was UB / OOB)") {
  // Found: golden_reader, final 600 s run (UBSan signed overflow in index.cpp place()): an
  // edited golden diffed as a dump with replay, its /inputs/block_table filled with 0x706c...:
  // the index replay ran select_blocks on it unchecked, page * kv_page_stride overflowed. The
  // same with seq_lens = 2^28 read index_scores out of bounds (ASan, select_long_candidates).
  golden::DiffOptions opt;
  opt.replay = true;
  const std::string golden = bases().world.bases[0].pristine_golden;
  auto index_step = [&](const std::string& dump) {
    const golden::DiffReport rep = golden::diff_files(golden, dump, opt);
    for (const golden::StageDiff& sd : rep.stages)
      if (sd.stage == "index" && sd.rank == 0 && !sd.replay.steps.empty()) return sd.replay.steps[0];
    FAIL("no index replay step");
    return golden::ReplayStep{};
  };
  const golden::ReplayStep a = index_step(bases().replay(regressions("golden_reader") / "replay_block_table_overflow", "r1.h5"));
  CHECK(!a.recomputed);
  CHECK_MESSAGE(a.not_replayed.find("inputs: block_table[0][0]: entry ") == 0, a.not_replayed);
  CHECK_MESSAGE(a.not_replayed.find(", the rank0/cache has 56") != std::string::npos, a.not_replayed);
  // (the program fills dataset 2 of the base's sorted list, /inputs/seq_lens since schema
  // version 2 has no /inputs/index_scores: it was dataset 3 before)
  const golden::ReplayStep b = index_step(bases().replay(regressions("golden_reader") / "replay_seq_lens_huge", "r2.h5"));
  CHECK(b.not_replayed == "inputs: seq_lens[0]: 268435456 is outside 0..1048576");
}

TEST_CASE("fuzz regression: a context of digits past int64 survives scenario_to_json (was std::out_of_range)") {
  // Found: scenario, 600 s run 4: {"context": ["1004999...9"]} (114 digits) parsed; the round
  // trip's scenario_to_json called std::stoll on it. Now it stays a string (validate_scenario
  // refuses it as a key count).
  const std::string text = fuzz::read_file((regressions("scenario") / "context_digits_past_int64").string());
  const Scenario s = scenario_from_json(text, "fuzz");
  std::string j;
  REQUIRE_NOTHROW(j = scenario_to_json(s));
  CHECK(scenario_to_json(scenario_from_json(j, "again")) == j);
  CHECK_THROWS_WITH_AS(validate_scenario(s, preset("tiny")), doctest::Contains("is neither a key count in 0..1048576"),
                       std::invalid_argument);
  CHECK(scenario_to_json(scenario_from_json(R"({"context": [123456789012345678]})", "t")).find("[123456789012345678]") !=
        std::string::npos);
}

TEST_CASE("review finding: short / medium / long with a config whose max_context is below their range") {
  // Found while writing the scenario target (its configs may change max_context), not by a
  // run: "long" with max_context 65536 divided by zero in Rng::range; "medium" with max_context
  // 16384 drew up to 65536 keys (validate_inputs: "seq_lens[0]: 35058 is outside 0..16384").
  Config c = preset("tiny", 1);
  c.max_context = 65536;
  REQUIRE_NOTHROW(c.validate());
  CHECK_THROWS_WITH_AS(validate_scenario(scenario_from_json(R"({"context": "long"})", "t"), c),
                       "scenario: context 'long' needs more than 65536 keys, past the config's max_context 65536",
                       std::invalid_argument);
  c.max_context = 1024;
  CHECK_THROWS_WITH_AS(validate_scenario(scenario_from_json(R"({"context": "medium"})", "t"), c),
                       "scenario: context 'medium' needs more than 2048 keys, past the config's max_context 1024",
                       std::invalid_argument);
  for (int max : {1024, 16384}) {
    c.max_context = max;
    for (const char* spec : {"short", "medium"}) {
      if (max == 1024 && std::string(spec) == "medium") continue;
      CAPTURE(max);
      CAPTURE(spec);
      Scenario s = scenario_from_json(std::string(R"({"tokens": 16, "context": ")") + spec + "\"}", "t");
      const StepInputs in = make_inputs(c, s, 3);
      CHECK_NOTHROW(validate_inputs(in, c));
      for (int32_t L : in.shared.seq_lens) CHECK(L <= max);
    }
  }
}

TEST_CASE("fuzz finding in libhdf5: a corrupt length makes HDF5 ask malloc for 40 TB; the readers report an error") {
  // Found: hdf5_bytes, 600 s run 1: H5C_protect malloc(0x250000000058) from a corrupt
  // metadata length. Inside libhdf5 (not fixed here): ASan aborts on the request, a normal
  // build's malloc returns NULL, HDF5 fails the call, and the readers say so.
  const std::string p = (regressions("hdf5_bytes") / "hdf5_h5c_protect_huge_malloc").string();
  CHECK_THROWS_AS(golden::GoldenReader{p}, golden::FormatError);
  golden::DiffOptions opt;
  CHECK_THROWS_WITH_AS(golden::diff_files(bases().world.bases[0].pristine_golden, p, opt),
                       doctest::Contains("H5Lexists failed"), golden::FormatError);
}

}  // TEST_SUITE fuzz_regressions
