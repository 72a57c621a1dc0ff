"""The artifact contract: what an aotc artifact is, how it is written, read, hashed and signed.

Everything an artifact may contain is defined here once (schema/, format.py and its changelog,
the ISA levels, the quantization layout), and both sides meet through it: the exporter and codegen
write through it, the runtime reads through it, and the C++ front end's rules are generated from
it (schema/rules.py -> scripts/gen_cpp_rules.py). It imports no compiler stage and no runtime
module (tests/test_budgets.py holds that).
"""
