"""The per-call cost of the sandbox: a trivial snippet through bwrap vs a plain subprocess.

Interleaved, so a machine that gets busier mid-run slows both alike. Prints every repeat and
the medians (wall and CPU seconds): what a user pays per tool call on top of the code itself.

    PYTHONPATH=. .venv/bin/python bench/sandbox.py --repeats 20
"""

from __future__ import annotations

import argparse
import statistics

from conspo.sandbox import run, sandbox_available

TRIVIAL = "print(1 + 1)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    repeats = parser.parse_args().repeats
    print("sandbox:", sandbox_available().reason)
    timings: dict[str, list[tuple[float, float]]] = {"bwrap": [], "subprocess": []}
    print(
        f"{'repeat':>6} {'bwrap wall':>11} {'bwrap cpu':>10} {'plain wall':>11} {'plain cpu':>10}"
    )
    for repeat in range(repeats):
        for kind in timings:
            result = run(TRIVIAL, unsafe_local=kind == "subprocess")
            assert result.stdout == "2\n", result
            timings[kind].append((result.wall_seconds, result.cpu_seconds))
        (bw, bc), (pw, pc) = timings["bwrap"][-1], timings["subprocess"][-1]
        print(f"{repeat:>6} {bw:>11.4f} {bc:>10.4f} {pw:>11.4f} {pc:>10.4f}")
    for kind, pairs in timings.items():
        wall = statistics.median(w for w, _ in pairs)
        cpu = statistics.median(c for _, c in pairs)
        print(f"median {kind:>10}: wall {wall:.4f} s, cpu {cpu:.4f} s")


if __name__ == "__main__":
    main()
