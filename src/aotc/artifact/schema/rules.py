"""Rules both front ends enforce, defined once here: the Python runtime reads them directly, and
scripts/gen_cpp_rules.py writes them into the C++ front end's header
(runtime/cpp/frontend/rules.h; tests/test_cpp_rules.py fails when that header is stale).

Stage: the artifact contract (what a loader accepts). In: nothing. Out: constants and error
templates (what / where / expected / found / fix, as aotc.errors takes them), which a caller
fills with `str.format` fields named in braces (`fill`).
"""
from __future__ import annotations

from aotc.artifact.isa import ORDER as ISA_ORDER, arch_of

MAX_STATE_BYTES = 1 << 40      # a module's state (a generator's caches), all of it
MAX_DIM = 1 << 40              # one dim of a state's shape
MAX_SIGNATURES = 64            # entries of signatures.json
MAX_KERNEL_BUFFERS = 4096      # a Triton kernel's parameters, buffers read and written (and so
                               # its extents, one per buffer): a backward's horizontally fused
                               # reductions read and write hundreds
MAX_BUNDLE = 16 << 20          # bytes of an OMS bundle (model.sig)
MAX_OMS_RESOURCES = 1 << 17    # resources of an OMS statement (a manifest lists at most 1 << 16)
LEVELS = tuple((level, arch_of(level)) for level in ISA_ORDER)   # CPU levels, lowest first
# a runner file's top-level fields (runtime/runner_file.py writes exactly these)
RUNNER_FIELDS = ("entry", "slots", "symbols", "exprs", "inputs", "steps", "outputs", "weights",
                 "state", "set_threads", "guards")

# A trust policy that names keys and yields none: every load refused (it fails closed).
NO_USABLE_KEY = dict(
    what="the trust policy names no usable key, so nothing can be trusted",
    where="trusted keys",
    expected="at least one public key or certificate (trusted_keys, --trusted-key, or key files "
             "in AOTC_TRUSTED_KEYS)",
    found="no usable key",
    fix="give the producer's public key (the .pub file `aotc keygen` wrote); to load without a "
        "signature, trust no key at all (unset AOTC_TRUSTED_KEYS, leave trusted_keys out)")

# A private key where a public key belongs: refused, its bytes never echoed.
PRIVATE_KEY = dict(
    what="a private key was given where a public key belongs",
    where="trusted_keys",
    expected="a public key or a certificate (the .pub file `aotc keygen` wrote)",
    found="a PEM PRIVATE KEY block (not shown)",
    fix="trust the public key; keep the private key secret, and replace it if it was shared")

# An entry whose plan fails while it runs on inputs its guards accept.
PLAN_FAILED = dict(
    what="entry {entry} failed inside its plan",
    where="{file}",
    expected="ATen calls that fit the plan's slots",
    found="{found}",
    fix="re-export the model with this aotc (the plan may be damaged or not aotc's); if a fresh "
        "export fails too, report it")

# A runner file that does not compute what its plan says (runtime/runner_file.py derives and
# compares the whole document; the C++ front end, frontend/runner_match.cpp, the program).
RUNNER_MISMATCH = dict(
    what="{file} does not match its plan", where="{file}",
    expected="the program derived from {plan}", found="{found}",
    fix="re-export; the runner file does not match its plan")

# OMS bundles (model.sig, artifact/oms.py; the C++ front end's oms.cpp): each refusal once.
_OMS_FIX = "re-sign the artifact (`aotc sign ART --key KEY`) or re-copy it from its producer"
OMS_MALFORMED = dict(
    what="model.sig is not an OMS signature bundle aotc reads", where="{where}",
    expected="a Sigstore bundle with a DSSE envelope (key or certificate method)",
    found="{found}", fix=_OMS_FIX)
OMS_KEYLESS = dict(
    what="model.sig is a keyless Sigstore signature, which needs the network", where="{where}",
    expected="a key or certificate signature", found="a bundle with transparency-log entries",
    fix="verify it with `model_signing verify sigstore`, or re-sign it with a key "
        "(`aotc sign ART --key KEY`)")
OMS_UNTRUSTED = dict(
    what="the OMS signature (model.sig) is not by a trusted key", where="{where}",
    expected="a signature by one of {ids}", found="{found}", fix=_OMS_FIX)
OMS_HASHING = dict(
    what="the OMS statement hashes the artifact in a way aotc does not check", where="{where}",
    expected="method 'files', hash_type 'sha256'", found="{found}", fix=_OMS_FIX)
OMS_NOT_SHA256 = dict(
    what="the OMS statement holds a digest that is not sha256", where="{where}",
    expected="sha256 digests", found="another algorithm", fix=_OMS_FIX)
OMS_TOO_MANY = dict(
    what="the OMS statement lists more resources than aotc reads", where="{where}",
    expected=f"at most {MAX_OMS_RESOURCES} resources", found="{found}", fix=_OMS_FIX)
OMS_NOT_EXACT = dict(
    what="the OMS signature does not cover exactly this artifact's files", where="{where}",
    expected="every file of the artifact with its sha256, and nothing else", found="{found}",
    fix=_OMS_FIX)

TEMPLATES = {"NO_USABLE_KEY": NO_USABLE_KEY, "PRIVATE_KEY": PRIVATE_KEY,
             "PLAN_FAILED": PLAN_FAILED, "RUNNER_MISMATCH": RUNNER_MISMATCH,
             "OMS_MALFORMED": OMS_MALFORMED,
             "OMS_KEYLESS": OMS_KEYLESS, "OMS_UNTRUSTED": OMS_UNTRUSTED,
             "OMS_HASHING": OMS_HASHING, "OMS_NOT_SHA256": OMS_NOT_SHA256,
             "OMS_TOO_MANY": OMS_TOO_MANY, "OMS_NOT_EXACT": OMS_NOT_EXACT}


def fill(template: dict, **fields) -> dict:
    """A template's texts with its "{name}" fields filled: the keyword arguments of an
    aotc.errors class (the C++ side: frontend/templates.h)."""
    return {k: v.format(**fields) for k, v in template.items()}
