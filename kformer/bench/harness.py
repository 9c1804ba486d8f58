"""What every benchmark shares: its results printed as a table, and kept as JSON if asked."""

import json


def report(results, print_table, json_path=None):
    """Prints `results` with `print_table`; writes them to `json_path` too, if given."""
    print_table(results)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
