// checkpoint_files.cpp -- see checkpoint_files.hpp.
#include "golden/inputs/checkpoint_files.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace k4 {
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";

std::string read_file(const fs::path& p, const std::string& what) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::invalid_argument(what + " " + p.string() + " cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string list_some(const std::vector<std::string>& v, size_t most = 4) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < most; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > most) s += ", and " + std::to_string(v.size() - most) + " more";
  return s;
}

}  // namespace

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  const auto bad = [&](const std::string& what) { throw std::invalid_argument("checkpoint " + path + ": " + what); };
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) throw std::invalid_argument("checkpoint " + path + " does not exist");
    dir_ = fs::path(path).parent_path().string();
    const std::string file = fs::path(path).filename().string();
    open_[file] = std::make_unique<st::File>(path);
    for (const std::string& n : open_[file]->names()) where_[n] = file;
    return;
  }
  dir_ = path;
  const fs::path index = fs::path(path) / kIndex, config = fs::path(path) / "config.json";
  if (fs::exists(index, ec)) {
    if (!fs::exists(config, ec))
      bad("config.json is missing (a checkpoint directory with " + std::string(kIndex) +
          " holds the model's config.json beside it: the shapes come from its text_config)");
    config_json_ = read_file(config, "config.json");
    has_index_ = true;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index, kIndex));
    } catch (const nlohmann::json::exception& e) {
      bad(std::string(kIndex) + " is not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      bad(std::string(kIndex) + " has no \"weight_map\" object of tensor name -> shard file");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) bad(std::string(kIndex) + ": weight_map entry '" + it.key() + "' is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        bad(std::string(kIndex) + ": weight_map entry '" + it.key() + "' names '" + f + "', not a file in the directory");
      where_[it.key()] = f;
    }
    return;
  }
  if (fs::exists(config, ec)) config_json_ = read_file(config, "config.json");
  std::vector<std::string> files;
  try {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
  } catch (const fs::filesystem_error& e) {
    bad("cannot list the directory (" + e.code().message() + ")");
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) bad("no *.safetensors file in the directory");
  for (const std::string& f : files) {
    open_[f] = std::make_unique<st::File>((fs::path(path) / f).string());
    for (const std::string& n : open_[f]->names()) {
      if (where_.count(n))
        bad("tensor '" + n + "' is in both " + (fs::path(path) / where_[n]).string() + " and " +
            (fs::path(path) / f).string());
      where_[n] = f;
    }
  }
}

std::string Checkpoint::find(const std::vector<std::string>& names) const {
  for (const std::string& n : names)
    if (has(n)) return n;
  return "";
}

std::string Checkpoint::shard_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : it->second;
}

std::vector<std::string> Checkpoint::missing_shards() const {
  std::set<std::string> files;
  for (const auto& kv : where_) files.insert(kv.second);
  std::vector<std::string> out;
  std::error_code ec;
  for (const std::string& f : files)
    if (!open_.count(f) && !fs::is_regular_file(fs::path(dir_) / f, ec)) out.push_back(f);
  return out;
}

std::vector<std::string> Checkpoint::require_shards(const std::vector<std::string>& names) const {
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const std::string& n : names)
    if (has(n)) by_shard[where_.at(n)].push_back(n);
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& [f, ns] : by_shard) {
    if (!open_.count(f) && !fs::is_regular_file(fs::path(dir_) / f, ec))
      throw std::invalid_argument("checkpoint " + path_ + ": shard " + f + " is not in the directory; " + kIndex +
                                  " puts " + std::to_string(ns.size()) + " tensors the layer reads in it (" +
                                  list_some(ns) + ")");
    out.push_back(f);
  }
  return out;
}

const st::File& Checkpoint::shard(const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(file);
  if (it != open_.end()) return *it->second;
  std::error_code ec;
  const fs::path p = fs::path(dir_) / file;
  if (!fs::is_regular_file(p, ec))
    throw std::invalid_argument("checkpoint " + path_ + ": shard " + file + " named by " + kIndex +
                                " is not in the directory");
  return *(open_[file] = std::make_unique<st::File>(p.string()));
}

const st::File& Checkpoint::holder(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw std::invalid_argument("checkpoint " + path_ + ": tensor '" + name + "' is missing");
  const st::File& f = shard(it->second);
  if (!f.has(name))
    throw std::invalid_argument("checkpoint " + path_ + ": " + kIndex + " puts tensor '" + name + "' in " + it->second +
                                ", which does not hold it");
  return f;
}

const st::TensorView& Checkpoint::at(const std::string& name) const { return holder(name).at(name); }

const st::TensorView& Checkpoint::get(const std::string& name, const std::vector<st::SafetensorsDtype>& dtypes,
                                      const std::vector<int64_t>& shape) const {
  return holder(name).get(name, dtypes, shape);
}

}  // namespace k4
