// policy.cpp -- k4.policy: the arithmetic policy's primitives (reference/numerics/policy.hpp)
// and the format conversions, element-wise over numpy arrays. They stand for the hardware
// instructions a kernel uses (hw_exp2, hw_rcp, hw_rsq, the FP8 / bf16 converts), so that a
// user's own implementation of a stage in numpy (examples/) gets the contract's bits.
#include "python/src/bind.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::py {
namespace {

template <class Out, class F>
pyb::array_t<Out> map(const pyb::array_t<float, pyb::array::c_style | pyb::array::forcecast>& x, F f) {
  if (!pyb::isinstance<pyb::array_t<float>>(x)) throw std::invalid_argument("k4.policy: a float32 array is expected");
  std::vector<pyb::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  pyb::array_t<Out> out(shape);
  const float* a = x.data();
  Out* o = out.mutable_data();
  const pyb::ssize_t n = x.size();
  for (pyb::ssize_t i = 0; i < n; ++i) o[i] = f(a[i]);
  return out;
}

// Values must arrive as float32: a float64 array would be rounded by the cast.
pyb::array_t<float, pyb::array::c_style | pyb::array::forcecast> f32_only(const pyb::array& x, const char* fn) {
  if (!x.dtype().is(pyb::dtype::of<float>()))
    throw std::invalid_argument(std::string("k4.policy.") + fn + ": a float32 array is expected, got " +
                                x.dtype().attr("name").cast<std::string>());
  return pyb::array_t<float, pyb::array::c_style | pyb::array::forcecast>::ensure(x);
}

}  // namespace

void bind_policy(pyb::module_& m) {
  pyb::module_ p = m.def_submodule("policy", "the arithmetic policy's primitives, element-wise (reference/numerics/policy.hpp)");
  p.def("exp2", [](const pyb::array& x) { return map<float>(f32_only(x, "exp2"), exp2_approx); }, "hw_exp2 (exp2_approx)");
  p.def("rcp", [](const pyb::array& x) { return map<float>(f32_only(x, "rcp"), rcp_approx); }, "hw_rcp (rcp_approx)");
  p.def("rsq", [](const pyb::array& x) { return map<float>(f32_only(x, "rsq"), rsq_approx); }, "hw_rsq (rsq_approx)");
  p.def("sigmoid", [](const pyb::array& x) { return map<float>(f32_only(x, "sigmoid"), sigmoid_approx); },
        "the seed's sigmoid: rcp(1 + exp2(x * -log2 e))");
  p.def("canon_nan", [](const pyb::array& x) { return map<float>(f32_only(x, "canon_nan"), canon_nan); },
        "every NaN as the canonical NaN (what a stage stores)");
  p.def("bf16", [](const pyb::array& x) { return map<uint16_t>(f32_only(x, "bf16"), bf16_bits_rne); },
        "f32 -> bf16 bits, round to nearest even, NaN -> 0x7FC0");
  p.def("e4m3", [](const pyb::array& x, bool saturate) {
    const Fp8Overflow rule = saturate ? Fp8Overflow::Saturate : Fp8Overflow::NoSaturate;
    return map<uint8_t>(f32_only(x, "e4m3"), [rule](float v) { return e4m3_bits(v, rule); });
  }, pyb::arg("x"), pyb::arg("saturate") = false, "f32 -> E4M3 bits (the FP8 convert; NoSaturate unless saturate)");
  p.attr("LOG2E") = kLog2e;
  p.attr("INV_FP8_MAX") = kInvFp8Max;
}

}  // namespace k4::py
