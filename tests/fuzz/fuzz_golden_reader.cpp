// fuzz_golden_reader.cpp -- libFuzzer target, structure-aware: the golden and dump readers
// (GoldenReader, DumpReader, diff_files with and without replay) on goldens and dumps
// edited through the HDF5 API.
//
// Feeds: an edit program (tests/fuzz/golden_edits.hpp documents the bytes): it picks one of
// five small valid bases (tiny-preset goldens at TP 1 and TP 2, whole and selected KV, dumps
// of them, an inputs file; written once a process into a tmpfs directory), copies it, and applies up
// to 64 edits through the HDF5 C API: deleted datasets, groups, links and attributes;
// datasets replaced by others of another element type, rank or shape; attributes set to
// other values or kinds (magic, schema_version, tp, tokens, n_pages, kv_form, dtype, ...);
// the config JSON edited; values changed inside datasets (seq_lens, block_table, page ids,
// expert_ids, route ids, sparse tables, ...); soft, hard and external links redirected;
// groups copied; the file truncated. Then the copy is read: GoldenReader (every stage of
// every rank, every stored expert), read_inputs_file, DumpReader (every schema dataset), and
// diff_files of the pristine golden against it and of it (as the golden) against a pristine
// dump, with replay when the flag byte says so (the reference stages then run on the edited
// tensors); one deep read an input, chosen by the flag byte (golden_edits.hpp, exercise()).
// HDF5's own parser is not the target (the file stays well-formed HDF5 unless truncated):
// fuzz_hdf5_bytes.cpp mutates raw bytes.
// Not findings: FormatError / std::invalid_argument (bad input, exit 2) and
// std::runtime_error (h5::Error: HDF5 refused a read).
// Findings: crashes, ASan / UBSan reports, std::logic_error, bad_alloc or any other
// exception, hangs (-timeout), huge allocations (-rss_limit_mb / -malloc_limit_mb).
// K4_FUZZ_VERBOSE=1 prints each input's edits (to see what a crash- file does);
// K4_FUZZ_INVENTORY=1 prints the bases' links, objects, datasets and attributes and exits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "tests/fuzz/golden_edits.hpp"

using namespace k4;

namespace {

struct State {
  fuzz::ScratchDir dir{"golden"};
  fuzz::World world;
  bool verbose = false;
  State() {
    world = fuzz::make_world(dir.path(""));
    verbose = fuzz::verbose();
  }
};

State& state() {
  static State s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  State& st = state();
  if (const char* v = std::getenv("K4_FUZZ_INVENTORY"); v && *v && *v != '0') {
    // What the edit programs' u16 picks index (tests/fuzz/corpus/make_seeds.py reads it).
    for (size_t i = 0; i < st.world.bases.size(); ++i) {
      const fuzz::Inventory& inv = st.world.bases[i].inv;
      std::printf("base %zu %s\n", i, st.world.bases[i].name.c_str());
      for (size_t k = 0; k < inv.links.size(); ++k) std::printf("link %zu %s %d\n", k, inv.links[k].path.c_str(), int(inv.links[k].kind));
      for (size_t k = 0; k < inv.objects.size(); ++k) std::printf("object %zu %s\n", k, inv.objects[k].c_str());
      for (size_t k = 0; k < inv.datasets.size(); ++k) std::printf("dataset %zu %s\n", k, inv.datasets[k].c_str());
      for (size_t k = 0; k < inv.attrs.size(); ++k)
        std::printf("attr %zu %s %s\n", k, inv.attrs[k].first.c_str(), inv.attrs[k].second.c_str());
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& st = state();
  fuzz::Bytes b(data, size);
  const fuzz::Base& base = st.world.bases[b.u8() % st.world.bases.size()];
  const uint8_t flags = b.u8();
  const std::string path = st.dir.path("edited.h5");
  std::filesystem::copy_file(base.path, path, std::filesystem::copy_options::overwrite_existing);
  std::string log;
  fuzz::apply_edits(path, base, b, st.verbose ? &log : nullptr);
  if (st.verbose) std::fprintf(stderr, "base %s, flags %u\n%s", base.name.c_str(), unsigned(flags), log.c_str());
  fuzz::exercise(base, path, flags);
  return 0;
}
