// A runner file held against its checked plan (plan_check.h check_runner_matches): the C++
// front end runs the runner file, so each thing it computes must be what the plan says. The
// plan's step i is the runner file's step i (runtime/cpp_runner.py _Spec: "call" for extern
// and view steps, "kernel", "free"), its arguments tagged as _Spec._arg tags them; a
// difference is refused with the template Python's check_runner_files raises (RUNNER_MISMATCH).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "plan_check.h"
#include "templates.h"

namespace aotc::fe {

namespace {

using json::Value;
using T = Value::Type;

struct Mismatch {
  std::string at;
};

const Value* member(const Value& v, const char* key) {
  if (v.type != T::Object) return nullptr;
  for (const auto& [k, x] : v.members)
    if (k == key) return &x;
  return nullptr;
}

const Value& item(const Value& v, size_t i, const std::string& at) {
  if (v.type != T::Array || i >= v.items.size()) throw Mismatch{at};
  return v.items[i];
}

void expect(bool ok, const std::string& at) {
  if (!ok) throw Mismatch{at};
}

bool same_int(const Value& v, int64_t i) { return v.type == T::Int && v.i == i; }

bool same_ints(const Value& a, const Value& b) {   // lists of integers (or nulls: -1)
  if (a.type != T::Array || b.type != T::Array || a.items.size() != b.items.size()) return false;
  for (size_t i = 0; i < a.items.size(); ++i) {
    const Value &x = a.items[i], &y = b.items[i];
    int64_t want = x.type == T::Null ? -1 : x.type == T::Int ? x.i : INT64_MIN;
    if (!same_int(y, want)) return false;
  }
  return true;
}

bool same_string(const Value& v, const std::string& s) { return v.type == T::String && v.s == s; }

// plan argument `p` against the runner file's tagged `t` (cpp_runner.py _Spec._arg,
// runner_file.py _tagged: non-finite floats as "inf", "-inf", "nan")
bool same_arg(const Value& p, const Value& t) {
  if (t.type != T::Array || t.items.empty() || t.items[0].type != T::String) return false;
  const std::string& tag = t.items[0].s;
  size_t n = t.items.size();
  switch (p.type) {
    case T::Null: return tag == "n" && n == 1;
    case T::Bool: return tag == "b" && n == 2 && t.items[1].type == T::Bool && t.items[1].b == p.b;
    case T::Int: return tag == "i" && n == 2 && same_int(t.items[1], p.i);
    case T::Float: return tag == "f" && n == 2 && t.items[1].type == T::Float && t.items[1].f == p.f;
    case T::String: return tag == "s" && n == 2 && same_string(t.items[1], p.s);
    case T::Array: {
      if (tag != "list" || n != 2 || t.items[1].type != T::Array || t.items[1].items.size() != p.items.size()) return false;
      for (size_t i = 0; i < p.items.size(); ++i)
        if (!same_arg(p.items[i], t.items[1].items[i])) return false;
      return true;
    }
    case T::Object: break;
  }
  if (p.members.size() != 1) return false;
  const auto& [ptag, v] = p.members[0];
  if (ptag == "slot") return tag == "slot" && n == 2 && v.type == T::Int && same_int(t.items[1], v.i);
  if (ptag == "sym") return tag == "sym" && n == 2 && t.items[1].type == T::Int;   // an expression's index
  if (ptag == "device") return tag == "device" && n == 1;
  if (ptag == "float") return tag == "f" && n == 2 && v.type == T::String && same_string(t.items[1], v.s);
  return tag == ptag && n == 2 && v.type == T::String && same_string(t.items[1], v.s);
}

void same_call(const Value& p, const Value& r, const std::string& at) {
  const Value& op = *member(p, "op");
  std::string qualname = item(r, 2, at).type == T::String && item(r, 3, at).type == T::String
                             ? item(r, 2, at).s + "." + item(r, 3, at).s : "";
  expect(qualname == op.s, at + " (op)");
  const Value& args = *member(p, "args");
  const Value& rargs = item(r, 4, at);
  expect(rargs.type == T::Array && rargs.items.size() == args.items.size(), at + " (arguments)");
  for (size_t i = 0; i < args.items.size(); ++i) expect(same_arg(args.items[i], rargs.items[i]), at + " (argument " + std::to_string(i) + ")");
  std::vector<std::pair<std::string, const Value*>> kw, rkw;   // in name order on both sides
  for (const auto& [k, v] : member(p, "kwargs")->members) kw.emplace_back(k, &v);
  for (const auto& kv : item(r, 5, at).items) {
    expect(kv.type == T::Array && kv.items.size() == 2 && kv.items[0].type == T::String, at + " (kwargs)");
    rkw.emplace_back(kv.items[0].s, &kv.items[1]);
  }
  std::sort(kw.begin(), kw.end()), std::sort(rkw.begin(), rkw.end());
  expect(kw.size() == rkw.size(), at + " (kwargs)");
  for (size_t i = 0; i < kw.size(); ++i) expect(kw[i].first == rkw[i].first && same_arg(*kw[i].second, *rkw[i].second), at + " (kwarg " + kw[i].first + ")");
  expect(same_ints(*member(p, "out"), item(r, 6, at)), at + " (results)");
  const Value* single = member(p, "single");
  expect(item(r, 7, at).type == T::Bool && item(r, 7, at).b == (single ? single->b : true), at + " (single)");
  const Value* binds = member(p, "binds");
  size_t nbinds = binds ? binds->members.size() : 0;
  expect(nbinds == 0 ? r.items.size() == 9 : r.items.size() == 10 && item(r, 9, at).items.size() == nbinds, at + " (binds)");
}

void same_kernel(const Value& p, const Value& r, const std::string& at) {
  expect(same_string(item(r, 2, at), member(p, "name")->s), at + " (kernel)");
  auto slots = [&](const Value& list, const char* what) {
    Value out;
    out.type = T::Array;
    for (const auto& a : list.items) out.items.push_back(item(a, 0, at + " (" + what + ")"));
    return out;
  };
  expect(same_ints(*member(p, "args"), slots(item(r, 4, at), "arguments")), at + " (arguments)");
  expect(same_ints(*member(p, "out"), slots(item(r, 5, at), "results")), at + " (results)");
  const Value* sizes = member(p, "sizes");
  expect(item(r, 6, at).type == T::Array && item(r, 6, at).items.size() == (sizes ? sizes->items.size() : 0), at + " (sizes)");
}

void same_steps(const Value& plan, const Value& runner) {
  const Value& steps = *member(plan, "steps");
  const Value* rsteps = member(runner, "steps");
  expect(rsteps && rsteps->type == T::Array && rsteps->items.size() == steps.items.size(), "steps");
  for (size_t i = 0; i < steps.items.size(); ++i) {
    const Value &p = steps.items[i], &r = rsteps->items[i];
    std::string at = "steps[" + std::to_string(i) + "]";
    const std::string& kind = member(p, "kind")->s;
    expect(same_int(item(r, 1, at), int64_t(i)), at);
    const Value& rkind = item(r, 0, at);
    if (kind == "free") {
      expect(same_string(rkind, "free") && same_ints(*member(p, "slots"), item(r, 2, at)), at + " (free)");
    } else if (kind == "kernel") {
      expect(same_string(rkind, "kernel"), at + " (kind)");
      same_kernel(p, r, at);
    } else {
      expect(same_string(rkind, "call"), at + " (kind)");
      same_call(p, r, at);
    }
  }
}

// weights [slot, stored name, dtype, ...] and state [slot, name, dtype, shape]: the plan's
// weight and state slots, in order (a weight by the name it is stored under: `aliases`, the
// manifest's weights.aliases, maps a tied name to it)
void same_constants(const Value& plan, const Value& runner, const Value& aliases) {
  std::vector<const Value*> weights, states;
  const Value& slots = *member(plan, "slots");
  for (size_t i = 0; i < slots.items.size(); ++i) {
    const std::string& kind = member(slots.items[i], "kind")->s;
    if (kind == "weight") weights.push_back(&slots.items[i]);
    if (kind == "state") states.push_back(&slots.items[i]);
  }
  const Value* rw = member(runner, "weights");
  expect(rw && rw->type == T::Array && rw->items.size() == weights.size(), "weights");
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::string& name = member(*weights[i], "weight")->s;
    const Value* alias = member(aliases, name.c_str());
    const Value& r = rw->items[i];
    std::string at = "weights[" + std::to_string(i) + "]";
    expect(same_int(item(r, 0, at), member(*weights[i], "id")->i) && same_string(item(r, 1, at), alias ? alias->s : name) &&
               same_string(item(r, 2, at), member(*weights[i], "dtype")->s),
           at);
  }
  const Value* rs = member(runner, "state");
  expect(rs && rs->type == T::Array && rs->items.size() == states.size(), "state");
  for (size_t i = 0; i < states.size(); ++i) {
    const Value& r = rs->items[i];
    std::string at = "state[" + std::to_string(i) + "]";
    expect(same_int(item(r, 0, at), member(*states[i], "id")->i) && same_string(item(r, 1, at), member(*states[i], "state")->s) &&
               same_string(item(r, 2, at), member(*states[i], "dtype")->s) && same_ints(*member(*states[i], "shape"), item(r, 3, at)),
           at);
  }
}

void same_outputs(const Value& plan, const Value& runner) {
  const Value& outs = *member(plan, "outputs");
  const Value* r = member(runner, "outputs");
  expect(r && r->type == T::Array && r->items.size() == outs.items.size(), "outputs");
  for (size_t i = 0; i < outs.items.size(); ++i) {
    std::string at = "outputs[" + std::to_string(i) + "]";
    const Value *slot = member(outs.items[i], "slot"), *c = member(outs.items[i], "const");
    Value none;
    expect(same_int(item(r->items[i], 0, at), slot ? slot->i : -1) && same_arg(slot ? none : *c, item(r->items[i], 1, at)), at);
  }
}

}  // namespace

void check_runner_matches(const Value& plan, const Value& runner, const std::string& file, const Value& aliases) {
  try {
    const Value* slots = member(runner, "slots");
    expect(slots && same_int(*slots, int64_t(member(plan, "slots")->items.size())), "slots");
    const Value* inputs = member(runner, "inputs");
    expect(inputs && same_ints(*member(plan, "inputs"), *inputs), "inputs");
    same_steps(plan, runner);
    same_outputs(plan, runner);
    same_constants(plan, runner, aliases);
  } catch (const Mismatch& m) {
    std::string entry = member(plan, "entry")->s;
    raise<ArtifactError>(rules::kRunnerMismatch, {{"file", file}, {"plan", "plans/" + entry + ".json"},
                                                   {"found", "at " + m.at + ": not what the plan says"}});
  }
}

}  // namespace aotc::fe
