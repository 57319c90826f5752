// tensors.hpp -- the schema table: every tensor of a golden, its dtype, its named dimensions
// and, for a stage output, its field of the model's RankResult (reference/model.hpp). The
// golden writer, the dump writer, the reader and the GPU runner's download all loop over this
// table: a new tensor is one row. The table is defined in schema.cpp; this header needs no
// HDF5 (device/runner.cu includes it), schema.hpp adds the stored form.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "reference/config.hpp"
#include "reference/model.hpp"

namespace k4::golden {

// The value types of stored tensors (attribute "dtype"); each is stored as raw bits in the
// integer type that holds it: bf16 -> uint16, f32 -> uint32, i32 -> int32, u8 / e4m3 /
// e8m0 / e2m1x2 (two E2M1 a byte, the even element in the low nibble) -> uint8.
enum class DType { BF16, F32, I32, U8, E4M3, E8M0, E2M1X2 };
const char* dtype_name(DType d);
bool dtype_from_name(const std::string& s, DType& out);
size_t dtype_bytes(DType d);

// A stage output's vector in a RankResult, of the element type the model keeps it in:
// u8 / e4m3 / e8m0 -> uint8_t, bf16 -> uint16_t, i32 -> int32_t, f32 -> float.
using ResultVec = std::variant<std::vector<uint8_t>*, std::vector<uint16_t>*, std::vector<int32_t>*, std::vector<float>*>;
using ResultField = ResultVec (*)(RankResult&);

// One row of the schema table.
struct TensorSpec {
  const char* group;    // "/inputs" or a rank-relative "<stage>/<inputs|outputs>"
  const char* name;
  DType dtype;
  const char* dims;     // comma-separated dimension names; "kv_scale", "expert_w13", "expert_w2" resolve by config
  const char* link;     // "" = stored here; else the target: "/inputs/x" or "@<stage>/<io>/x" (same rank)
  const char* meaning;
  ResultField field = nullptr;  // stage outputs: where the model's result holds it
};
const std::vector<TensorSpec>& tensor_specs();
const TensorSpec& find_spec(const std::string& group, const std::string& name);  // logic_error if absent
std::vector<const TensorSpec*> specs_of(const std::string& group);  // the rows of "split/outputs", in table order
const std::vector<std::string>& stage_names();  // index, split, merge, oproj, router, moe
int stage_of(const TensorSpec& s);  // 0 (index) .. 5 (moe); -1 for the shared /inputs
// The row whose field a tensor is: itself (a stage output), the output a stage input links
// to ("@split/outputs/q8"), or nullptr (a weight, a KV page, a shared input).
const TensorSpec* result_spec(const TensorSpec& s);

// fn(v) with the result's vector of tensor s (std::vector<T>&, T the model's element type);
// s must have a field whose element type is the dtype's (logic_error otherwise).
template <class Fn>
void with_field(const TensorSpec& s, RankResult& r, Fn&& fn) {
  if (!s.field) throw std::logic_error(std::string("schema: ") + s.group + "/" + s.name + " is no result field");
  const ResultVec v = s.field(r);
  const size_t want = s.dtype == DType::BF16 ? 1 : s.dtype == DType::I32 ? 2 : s.dtype == DType::F32 ? 3 : 0;
  if (v.index() != want) throw std::logic_error(std::string("schema: the result field of ") + s.group + "/" + s.name +
                                                " is not of " + dtype_name(s.dtype) + "'s element type");
  std::visit([&](auto* p) { fn(*p); }, v);
}
template <class Fn>
void with_field(const TensorSpec& s, const RankResult& r, Fn&& fn) {
  with_field(s, const_cast<RankResult&>(r), [&](const auto& v) { fn(v); });
}

// Sizes of the named dimensions of one file (token, hidden, page, used_expert, ...).
struct DimSizes {
  Config cfg;
  int tokens = 0, bt_width = 0, score_width = 0;
  int pages = 0;        // pages stored in /rank<r>/split/inputs (whole cache or the selection)
  int used_experts = 0; // experts stored in /rank<r>/moe/inputs
  int64_t of(const std::string& dim) const;                 // throws on an unknown name
  std::vector<uint64_t> shape(const char* dims) const;
  uint64_t count(const char* dims) const;                   // elements: the shape's product
  std::string dims_of(const char* dims) const;              // "kv_scale", "expert_w13", "expert_w2" resolved
  DType dtype_of(const TensorSpec& s) const;                // spec_dtype(s, cfg) (schema.hpp)
};

}  // namespace k4::golden
