"""Command-line options the benchmarks share."""
import argparse


def seeds_parser(doc, models, seeds_help):
    """The parser of a benchmark run once per model and seed: --lopper (the binary, required),
    --models (comma-separated, `models` by default), --seeds (0,1 by default)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", required=True)
    ap.add_argument("--models", default=models)
    ap.add_argument("--seeds", default="0,1", help=seeds_help)
    return ap


def int_options(ap, **defaults):
    """Adds one integer option --NAME per keyword, its default the keyword's value, in the order
    given (the order --help lists them in)."""
    for name, default in defaults.items():
        ap.add_argument(f"--{name}", type=int, default=default)
