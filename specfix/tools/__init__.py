"""Tooling shared by the chapters: the benchmark, the chi-square test, the host-sync counter, the GPU
recordings, the map of which vLLM file each module mirrors, and the crash-log diagnosis (``specfix
diagnose``)."""
