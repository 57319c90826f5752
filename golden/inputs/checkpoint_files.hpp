// checkpoint_files.hpp -- the files of a safetensors checkpoint and where each tensor lives.
//
// PATH is one of
//  - a release directory: config.json, model.safetensors.index.json ({"weight_map": {tensor:
//    shard file}}) and the shards. Names resolve through the index; a shard is opened (mapped)
//    only when a tensor in it is read, so a user who downloaded only one layer's shards can
//    use the directory. require_shards() names a shard the index lists but the disk lacks;
//  - a directory of *.safetensors without an index (every file mapped; a name in one only);
//  - one .safetensors file (the single-file `k4 synth` form).
// Every message names the checkpoint path, the shard and the tensor (std::invalid_argument).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "golden/io/safetensors.hpp"

namespace k4 {

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  const std::string& path() const { return path_; }
  bool has_index() const { return has_index_; }
  // config.json's text ("" when the directory has none; a directory with an index must have it).
  const std::string& config_json() const { return config_json_; }

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The first of `names` the checkpoint holds, or "" (no shard is opened).
  std::string find(const std::vector<std::string>& names) const;
  // The shard file of a tensor, relative to the directory ("" if absent).
  std::string shard_of(const std::string& name) const;
  // Shards holding any of `names` (sorted); a shard missing on disk is an error that names it
  // and which of `names` it holds.
  std::vector<std::string> require_shards(const std::vector<std::string>& names) const;
  // Shards the index names that are not on disk.
  std::vector<std::string> missing_shards() const;

  const st::TensorView& at(const std::string& name) const;  // opens the shard on demand
  const st::TensorView& get(const std::string& name, const std::vector<st::SafetensorsDtype>& dtypes,
                            const std::vector<int64_t>& shape) const;

 private:
  const st::File& shard(const std::string& file) const;
  const st::File& holder(const std::string& name) const;
  std::string path_, dir_, config_json_;
  bool has_index_ = false;
  std::map<std::string, std::string> where_;  // tensor -> shard file (relative to dir_)
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<st::File>> open_;
};

}  // namespace k4
