// Plans and the manifest's entries, checked in C++ as Python's schema checks them
// (artifact/schema/plan.py, flow.py, manifest.py, expr.py): the C++ front end runs the runner
// file its plan derives, and refuses an artifact whose plan (plans/<entry>.json) or entry
// Python refuses, so that both front ends give one verdict on one artifact (issue 45).
//
// Every table, limit, pattern and record's fields come from the Python definitions through
// rules.h (scripts/gen_cpp_rules.py); each refusal is an ArtifactError naming the file and
// the field (json::Field::fail).
#pragma once

#include <set>
#include <string>

#include "files.h"
#include "json.h"

namespace aotc::fe {

// The manifest's own records (manifest_check.cpp): its fields, producer, model, options,
// target, weights, at least one entry, and the files the format requires listed.
void check_manifest(const Artifact& art);

// The manifest's entry `name` (`entry`) and its plan, read from `art` (verified bytes): the
// plan's document, checked.
json::Value check_entry_and_plan(const Artifact& art, const std::string& name, const json::Field& entry);

// A runner file (`runner`, named `file`) runs what its checked plan (`plan`) says: the same
// steps in the same order (each step's op or kernel, its arguments, the slots it reads and
// writes, the slots it frees), inputs, outputs, weights and state slots (runtime/runner_file.py
// derives the file from the plan; Python compares the whole document).
// `aliases`: the manifest's weights.aliases (tied name -> the name a weight is stored under).
void check_runner_matches(const json::Value& plan, const json::Value& runner, const std::string& file,
                          const json::Value& aliases);

// A size expression (or, with `boolean`, a relation) of the grammar (artifact/schema/expr.py)
// over the declared `symbols`; an ArtifactError naming `f` where it is not.
void check_expr(const json::Field& f, const std::set<std::string>& symbols, bool boolean);

}  // namespace aotc::fe
