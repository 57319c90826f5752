// adapter.cpp -- run_stage_with: named host tensors in, the stage, named tensors out.
#include "device/kut/adapter.hpp"

#include <cstdio>
#include <cstring>
#include <exception>

namespace k4::kut {

int run_stage_with(const StageFns& fns, k4_kut_stage_call* call, char* error, size_t error_size) {
  try {
    const Config cfg = golden::config_from_json(call->config_json, "kernel-under-test call");
    NamedTensors in, out;
    for (int i = 0; i < call->n_inputs; ++i) {
      const k4_kut_tensor& t = call->inputs[i];
      NamedTensor& n = in[t.name];
      n.dtype = golden::DType(t.dtype);
      n.shape.assign(t.shape, t.shape + t.ndim);
      n.bytes.resize(t.bytes);
      if (t.bytes) std::memcpy(n.bytes.data(), t.data, t.bytes);
    }
    run_named_stage(fns, call->stage, cfg, call->rank, call->tokens, call->q_len, in, out);
    for (int i = 0; i < call->n_outputs; ++i) {
      k4_kut_tensor& t = call->outputs[i];
      auto it = out.find(t.name);
      if (it == out.end()) throw std::invalid_argument(std::string("no output '") + t.name + "' of stage " + call->stage);
      if (it->second.bytes.size() != t.bytes)
        throw std::invalid_argument(std::string("output '") + t.name + "': " + std::to_string(it->second.bytes.size()) +
                                    " bytes, the buffer holds " + std::to_string(t.bytes));
      if (t.bytes) std::memcpy(t.data, it->second.bytes.data(), t.bytes);
    }
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return 1;
  }
}

}  // namespace k4::kut
