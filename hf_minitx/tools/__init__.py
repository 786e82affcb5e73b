"""Tools around the models: visualisation (PNG pictures), the explorer (one HTML page), the paper's toy
experiments, the benchmark, the demo and the GPU check. Each module's `main(argv)` is a `minitx` subcommand."""
