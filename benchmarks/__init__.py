"""aotc's benchmark suite: eager vs torch.compile vs AOTInductor vs aotc on real architectures,
in one run on one machine.

    models.py    the registry: architectures built from configs (random weights), sizes, points
    systems.py   one adapter per system under test
    accuracy.py  the accuracy rule (against a float64 reference, relative to eager's error)
    harness.py   the protocol for one (model, point): reference, build, first call, accuracy,
                 interleaved timing
    report.py    summary (pass rate, geomeans), results.json and results.md; merging parts
    plot.py      results.png
    run.py       the command line: `python -m benchmarks.run --device cpu --suite small`
    gpu.sh       the GPU run: fp32 and bf16, in parts of under 10 minutes each
"""
