// aotc.runtime._runner: the C++ plan runner as the Python runtime calls it.
//
// runtime/cpp_runner.py builds a spec of plain tuples from a plan the schema has checked; this
// file turns it into aotc::spec::Program (Program checks it again) and runs calls with the GIL
// released, so concurrent calls from Python threads run concurrently, as the Python runner's
// kernels and ATen calls do.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include "include/aotc/errors.h"
#include "frontend/graphs.h"
#include "guards.h"
#include "program.h"

namespace py = pybind11;

namespace aotc {
at::Tensor few_rows_mm(const at::Tensor& x, const at::Tensor& w);   // few_rows.cpp
}

namespace {

using aotc::spec::Arg;
using aotc::spec::Dim;

std::vector<Dim> dims(const py::handle& obj) {
  std::vector<Dim> out;
  for (const py::handle& d : obj) {
    Dim dim;
    if (py::isinstance<py::list>(d))
      dim.expr = py::cast<int32_t>(d.cast<py::list>()[0]);
    else
      dim.value = py::cast<int64_t>(d);
    out.push_back(dim);
  }
  return out;
}

Arg arg(const py::handle& obj) {
  auto t = obj.cast<py::tuple>();
  auto tag = t[0].cast<std::string>();
  Arg a;
  using K = Arg::Kind;
  static const std::pair<const char*, K> kTags[] = {
      {"n", K::None}, {"b", K::Bool}, {"i", K::Int}, {"f", K::Float}, {"s", K::String},
      {"slot", K::Slot}, {"sym", K::Sym}, {"list", K::List}, {"dtype", K::DType},
      {"layout", K::Layout}, {"memory_format", K::MemoryFormat}, {"device", K::Device}};
  bool known = false;
  for (const auto& [name, kind] : kTags)
    if (tag == name) a.kind = kind, known = true;
  if (!known) throw std::invalid_argument("unknown argument tag " + tag);
  switch (a.kind) {
    case K::Bool: a.b = t[1].cast<bool>(); break;
    case K::Int: case K::Slot: case K::Sym: a.i = t[1].cast<int64_t>(); break;
    case K::Float: a.f = t[1].cast<double>(); break;
    case K::String: case K::DType: case K::Layout: case K::MemoryFormat:
      a.s = t[1].cast<std::string>();
      break;
    case K::List:
      for (const py::handle& x : t[1]) a.items.push_back(arg(x));
      break;
    default: break;
  }
  return a;
}

// Runs a Python callable as a Triton kernel's launcher, `fn((gx, gy, gz), *buffers, [flag],
// *sizes)`: the interpreter's kernels of a CUDA artifact loaded with interpret=True.
class PyLauncher final : public aotc::Launcher {
 public:
  explicit PyLauncher(py::object fn)
      : fn_(new py::object(std::move(fn)), [](py::object* o) {
          py::gil_scoped_acquire gil;
          delete o;
        }) {}

  void launch(const std::array<int64_t, 3>& grid, c10::ArrayRef<at::Tensor> buffers,
              const at::Tensor& flag, c10::ArrayRef<int64_t> sizes) const override {
    py::gil_scoped_acquire gil;
    py::list args;
    args.append(py::make_tuple(grid[0], grid[1], grid[2]));
    for (const at::Tensor& b : buffers) args.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(b)));
    if (flag.defined()) args.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(flag)));
    for (int64_t z : sizes) args.append(z);
    (*fn_)(*args);
  }

 private:
  std::shared_ptr<py::object> fn_;
};

// runtime/cuda.py CudaLauncher.runner_spec(): a cubin's function and how to launch it.
std::shared_ptr<const aotc::Launcher> cuda_launcher(const py::dict& d) {
  aotc::CudaKernelSpec k;
  k.name = d["name"].cast<std::string>();
  k.function = d["function"].cast<intptr_t>();
  k.shared = d["shared"].cast<int64_t>();
  k.div16_function = d["div16_function"].cast<intptr_t>();
  k.div16_shared = d["div16_shared"].cast<int64_t>();
  k.aligned = d["aligned"].cast<std::vector<int32_t>>();
  k.threads = d["threads"].cast<int64_t>();
  k.ctas = d["ctas"].cast<int64_t>();
  k.pdl = d["pdl"].cast<bool>();
  k.pointers = d["pointers"].cast<std::vector<bool>>();
  k.inputs = d["inputs"].cast<std::vector<bool>>();
  for (const auto& [bytes, align] : d["scratch"].cast<std::vector<std::pair<int64_t, int64_t>>>())
    k.scratch.push_back({bytes, align});
  k.context = d["context"].cast<intptr_t>();
  k.device = d["device"].cast<int32_t>();
  return aotc::cuda_launcher(std::move(k));
}

// A Triton kernel's (launcher, grid dims, error code[, extents]): the launcher a runner_spec
// dict (a cubin) or a callable; the extents (format >= 19) its launch spec's.
void triton_launch(aotc::spec::Step& s, const py::tuple& t) {
  s.launcher = py::isinstance<py::dict>(t[0]) ? cuda_launcher(t[0].cast<py::dict>())
                                               : std::make_shared<PyLauncher>(t[0].cast<py::object>());
  s.grid = dims(t[1]);
  s.error_code = t[2].cast<int32_t>();
  if (t.size() > 3) s.extents = dims(t[3]);
}

aotc::spec::Step kernel_step(const py::tuple& t) {
  aotc::spec::Step s;
  s.kind = aotc::spec::Step::Kind::Kernel;
  s.name = t[2].cast<std::string>();
  s.fn = t[3].cast<intptr_t>();
  for (const py::handle& h : t[4]) {
    auto a = h.cast<py::tuple>();
    s.args.push_back({a[0].cast<int32_t>(), a[1].cast<bool>(), a[2].cast<bool>(), dims(a[3])});
    if (a.size() > 5) s.args.back().shape = dims(a[4]), s.args.back().dtype = a[5].cast<std::string>();
  }
  for (const py::handle& h : t[5]) {
    auto o = h.cast<py::tuple>();
    s.outs.push_back({o[0].cast<int32_t>(), o[1].cast<std::string>(), dims(o[2]), dims(o[3]),
                      o[4].cast<bool>(), o[5].cast<int32_t>(), o[6].cast<bool>()});
  }
  s.sizes = t[6].cast<std::vector<int32_t>>();
  if (t.size() > 7 && py::isinstance<py::bool_>(t[7]))   // a C++ kernel: takes the room?
    s.room = t[7].cast<bool>();
  else if (t.size() > 7)
    triton_launch(s, t[7].cast<py::tuple>());
  return s;
}

aotc::spec::Step step(const py::handle& obj) {
  auto t = obj.cast<py::tuple>();
  auto kind = t[0].cast<std::string>();
  aotc::spec::Step s;
  if (kind == "kernel") {
    s = kernel_step(t);
  } else if (kind == "call") {
    s.kind = aotc::spec::Step::Kind::Call;
    s.op = t[2].cast<std::string>();
    s.overload = t[3].cast<std::string>();
    for (const py::handle& a : t[4]) s.call_args.push_back(arg(a));
    for (const py::handle& kv : t[5]) {
      auto p = kv.cast<py::tuple>();
      s.kwargs.emplace_back(p[0].cast<std::string>(), arg(p[1]));
    }
    s.out = t[6].cast<std::vector<int32_t>>();
    s.single = t[7].cast<bool>();
    s.fold = t[8].cast<bool>();
    if (t.size() > 9)   // (symbol, result, dim or -1, lo, hi) per value-dependent size
      for (const py::handle& h : t[9]) {
        auto b = h.cast<py::tuple>();
        s.binds.push_back({b[0].cast<int32_t>(), b[1].cast<int32_t>(), b[2].cast<int32_t>(),
                           b[3].cast<int64_t>(), b[4].cast<int64_t>()});
      }
  } else if (kind == "free") {
    s.kind = aotc::spec::Step::Kind::Free;
    s.slots = t[2].cast<std::vector<int32_t>>();
  } else {
    throw std::invalid_argument("unknown step kind " + kind);
  }
  s.index = t[1].cast<int32_t>();
  return s;
}

// A constant of the spec: a tensor (weights, state), or a number, string, bool or None.
c10::IValue constant(const py::handle& obj) {
  if (THPVariable_Check(obj.ptr())) return THPVariable_Unpack(obj.ptr());
  if (obj.is_none()) return c10::IValue();
  if (py::isinstance<py::bool_>(obj)) return obj.cast<bool>();
  if (py::isinstance<py::int_>(obj)) return obj.cast<int64_t>();
  if (py::isinstance<py::float_>(obj)) return obj.cast<double>();
  if (py::isinstance<py::str>(obj)) return obj.cast<std::string>();
  throw py::type_error("a constant that is not a tensor, number, string or None");
}

std::unique_ptr<aotc::Program> make_program(const py::dict& d) {
  aotc::spec::Program p;
  p.entry = d["entry"].cast<std::string>();
  p.slots = d["slots"].cast<int32_t>();
  p.symbols = d["symbols"].cast<int32_t>();
  p.exprs = d["exprs"].cast<std::vector<std::vector<int64_t>>>();
  for (const py::handle& h : d["constants"]) {
    auto c = h.cast<py::tuple>();
    p.constants.emplace_back(c[0].cast<int32_t>(), constant(c[1]));
  }
  if (d.contains("varying")) p.varying = d["varying"].cast<std::vector<int32_t>>();
  p.inputs = d["inputs"].cast<std::vector<int32_t>>();
  for (const py::handle& h : d["steps"]) p.steps.push_back(step(h));
  for (const py::handle& h : d["outputs"]) {
    auto o = h.cast<py::tuple>();
    aotc::spec::Output out;
    out.slot = o[0].cast<int32_t>();
    out.constant = constant(o[1]);
    p.outputs.push_back(std::move(out));
  }
  p.device = c10::Device(d["device"].cast<std::string>());
  p.set_threads = d["set_threads"].cast<intptr_t>();
  return std::make_unique<aotc::Program>(std::move(p));
}

at::Tensor input(PyObject* obj, size_t i) {
  if (!THPVariable_Check(obj))
    throw py::type_error("input #" + std::to_string(i) + " is not a tensor");
  return THPVariable_Unpack(obj);
}

// A tuple of outputs, or, when a kernel met an index out of range, a list [step index, that
// kernel's arguments...], or, when a call bound a size out of its range, a list [step index,
// "size", symbol index, value].
py::object results(aotc::RunResult& r) {
  if (r.failed_step < 0) {
    py::tuple out(r.outputs.size());
    for (size_t i = 0; i < r.outputs.size(); ++i)
      out[i] = torch::jit::toPyObject(std::move(r.outputs[i]));
    return std::move(out);
  }
  py::list failed;
  failed.append(r.failed_step);
  if (r.failed_symbol >= 0) {
    failed.append(py::str("size"));
    failed.append(r.failed_symbol);
    failed.append(r.failed_value);
    return std::move(failed);
  }
  for (auto& v : r.failed_args) failed.append(torch::jit::toPyObject(std::move(v)));
  return std::move(failed);
}

// Run with `inputs` (a tuple, or a list the caller hands over: emptied here, so the plan's
// free steps release each input after its last use); see `results`.
aotc::RunResult run_plan(const aotc::Program& p, const py::handle& inputs,
                         const std::vector<int64_t>& syms, bool read_flag) {
  std::vector<c10::IValue> in;
  PyObject* seq = inputs.ptr();
  bool handed = PyList_CheckExact(seq);
  if (!handed && !PyTuple_Check(seq)) throw py::type_error("inputs must be a tuple or a list");
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; ++i) in.emplace_back(input(items[i], size_t(i)));
  if (handed) PyList_SetSlice(seq, 0, n, nullptr);
  py::gil_scoped_release released;
  return p.run(std::move(in), syms, read_flag);
}

py::object run(const aotc::Program& p, const py::handle& inputs, const std::vector<int64_t>& syms) {
  aotc::RunResult r = run_plan(p, inputs, syms, true);
  return results(r);
}

// `run` inside a CUDA graph capture: (outputs, the error flag or None), the flag not read.
py::object run_deferred(const aotc::Program& p, const py::handle& inputs,
                        const std::vector<int64_t>& syms) {
  aotc::RunResult r = run_plan(p, inputs, syms, false);
  py::object flag = r.flag.defined() ? torch::jit::toPyObject(c10::IValue(r.flag)) : py::none();
  return py::make_tuple(results(r), flag);
}

// What a user's call runs (CompiledModule.run_flat): the guards, then the plan with grad mode
// off; None where a guard fails (the caller's Python guards then raise the error).
py::object call(const aotc::Program& p, const aotc::Guards& g, const py::tuple& args,
                bool check) {
  std::vector<at::Tensor> in;
  for (const py::handle& a : args) {
    if (!THPVariable_Check(a.ptr())) return py::none();
    in.push_back(THPVariable_Unpack(a.ptr()));
  }
  std::vector<int64_t> syms;
  if (!g.bind(in, check, syms)) return py::none();
  aotc::RunResult r;
  {
    py::gil_scoped_release released;
    at::NoGradGuard no_grad;
    r = p.run(std::vector<c10::IValue>(in.begin(), in.end()), syms);
  }
  return results(r);
}

std::unique_ptr<aotc::Guards> make_guards(const py::dict& d) {
  aotc::spec::Guards g;
  g.symbols = d["symbols"].cast<int32_t>();
  g.ranges = d["ranges"].cast<std::vector<std::pair<int64_t, int64_t>>>();
  g.exprs = d["exprs"].cast<std::vector<std::vector<int64_t>>>();
  g.relations = d["relations"].cast<std::vector<int32_t>>();
  g.plan_symbols = d["plan_symbols"].cast<std::vector<int32_t>>();
  g.device = d["device"].cast<std::string>();
  for (const py::handle& h : d["inputs"]) {
    auto t = h.cast<py::tuple>();
    aotc::spec::GuardInput in;
    in.dtype = t[0].cast<std::string>();
    for (const py::handle& dim : t[1]) {
      auto p = dim.cast<std::pair<int, int64_t>>();   // (kind, value)
      if (p.first < 0 || p.first > 2) throw std::invalid_argument("a guard dim kind");
      in.dims.push_back({static_cast<aotc::spec::GuardDim::Kind>(p.first), p.second});
    }
    g.inputs.push_back(std::move(in));
  }
  return std::make_unique<aotc::Guards>(std::move(g));
}

}  // namespace

// An ATen error inside a call reaches Python as torch's own bindings raise it (the class by
// kind, the message without the C++ backtrace), as it would from the Python runner.
// An aotc error a runner op raises (aotc/errors.py's class of its kind, with its fields).
void translate_aten_errors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const aotc::AotcError& e) {
    py::object cls = py::module_::import("aotc.errors").attr(e.kind());
    py::object err = cls(e.message(), py::arg("where") = e.where(), py::arg("expected") = e.expected(),
                         py::arg("found") = e.found(), py::arg("fix") = e.fix());
    PyErr_SetObject(cls.ptr(), err.ptr());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

PYBIND11_MODULE(_runner, m) {
  m.doc() = "aotc's C++ plan runner (runtime/cpp)";
  py::register_exception_translator(&translate_aten_errors);
  py::register_exception<aotc::SpecError>(m, "SpecError");
  py::register_exception<aotc::Unsupported>(m, "Unsupported");
  m.attr("TORCH_VERSION") = AOTC_TORCH_VERSION;   // the torch this was built against
  // why the C++ front end (aotc::Module) runs CUDA artifacts without CUDA graphs ("": it has them)
  m.attr("GRAPHS_MISSING") = aotc::fe::graphs_unavailable();
  py::class_<aotc::Program>(m, "Program")
      .def(py::init(&make_program))
      .def_property_readonly("entry", &aotc::Program::entry)
      .def("run", &run)
      .def("run_deferred", &run_deferred)
      .def("call", &call);
  py::class_<aotc::Guards>(m, "Guards").def(py::init(&make_guards));
  // aten::mm as the runner computes it (few_rows.cpp): the Python runner's too, so both agree
  m.def("mm", &aotc::few_rows_mm, py::call_guard<py::gil_scoped_release>());
}
