// adapter.cpp -- run_stage_with: named host tensors in, the stage, named tensors out.
#include "device/kut/adapter.hpp"

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

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

int run_stage_via_host(RunStageFn host_run, Memory& mem, k4_kut_stage_call* call, char* error, size_t error_size) {
  try {
    // host copies of every tensor: inputs to read, outputs as the harness filled them
    auto to_host = [&](const k4_kut_tensor* t, int n, std::vector<std::vector<uint8_t>>& data, std::vector<k4_kut_tensor>& desc) {
      data.resize(size_t(n)), desc.assign(t, t + n);
      for (int i = 0; i < n; ++i) {
        data[size_t(i)].resize(t[i].bytes);
        mem.to_host(data[size_t(i)].data(), t[i].data, t[i].bytes);
        desc[size_t(i)].data = data[size_t(i)].data();
      }
    };
    std::vector<std::vector<uint8_t>> in_data, out_data;
    std::vector<k4_kut_tensor> in, out;
    to_host(call->inputs, call->n_inputs, in_data, in);
    to_host(call->outputs, call->n_outputs, out_data, out);
    k4_kut_stage_call host = *call;
    host.inputs = in.data(), host.outputs = out.data(), host.stream = nullptr;
    const int rc = host_run(&host, error, error_size);
    if (rc != 0) return rc;
    for (int i = 0; i < call->n_outputs; ++i) mem.to_device(call->outputs[i].data, out_data[size_t(i)].data(), out_data[size_t(i)].size());
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return 1;
  }
}

}  // namespace k4::kut
