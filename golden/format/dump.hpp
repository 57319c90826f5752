// dump.hpp -- a dump: what a kernel runner writes, in the golden schema (schema.hpp), holding
// some ranks, stages and tensors of a step's results. k4 diff / k4 replay read it
// (golden/diff/compare.hpp).
#pragma once
#include <string>
#include <vector>

#include "golden/format/schema.hpp"

namespace k4::golden {

// What write_dump stores: empty lists mean every rank / every stage; omit names tensors
// ("split/outputs/o", or "rank1/split/outputs/o" for one rank) left out.
struct DumpSelection {
  std::vector<int> ranks;
  std::vector<std::string> stages;
  std::vector<std::string> omit;
};

// A dump in the golden schema: root attributes magic, schema_version, config, tp, tokens,
// kind = "dump"; /rank<r>/<stage>/outputs/* of the selection (dtype, dims, meaning
// attributes as in a golden). What a kernel runner writes; the tests' planted faults too.
void write_dump(const std::string& path, const Config& cfg, int tokens, const StepResult& res,
                const DumpSelection& sel = {}, bool overwrite = false);

}  // namespace k4::golden
