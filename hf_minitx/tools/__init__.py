"""Tools around the models: visualisation, the paper's toy experiments, the benchmark, the demo and the
GPU check. Each module's `main(argv)` is a `minitx` subcommand."""
