"""``trainer.nproc=N``'s pre-flight check in a process of its own: the launcher checks once what each rank would
check (rlft.training.components.preflight: reward functions and environments import, reward-model and judge paths, the
batch divides among the ranks) without importing transformers or the user's modules itself, so the process that
only waits for its ranks stays small and runs none of the user's code.

    python -m rlft.parallel.preflight WORLD < RESOLVED_YAML   (prints one JSON line: {} or {"error", "kind"})
"""

from __future__ import annotations

import json
import subprocess
import sys

from rlft import errors
from rlft.config.loading import compose_on
from rlft.errors import RlftError, how_it_ended


def run_elsewhere(resolved_yaml: str, world: int) -> None:
    """Run the check in a child python on the job's resolved config.

    Raises:
        RlftError: the check's own error (its class and line), or one saying how the child ended.
    """
    proc = subprocess.run([sys.executable, "-m", "rlft.parallel.preflight", str(world)], input=resolved_yaml,
                          capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else None
    except ValueError:
        said = None
    if proc.returncode == 0 and isinstance(said, dict):
        if "error" in said:
            kind = getattr(errors, str(said.get("kind")), None)
            cls = kind if isinstance(kind, type) and issubclass(kind, RlftError) else RlftError
            raise cls(said["error"])
        return
    last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
    raise RlftError(f"the pre-flight check of trainer.nproc's ranks {how_it_ended(proc.returncode)}: {last}")


def main() -> int:
    from rlft.training.components import preflight  # torch, transformers, the user's modules: here only

    try:
        preflight(compose_on(sys.stdin.read(), []), int(sys.argv[1]))
    except RlftError as e:
        print(json.dumps({"error": str(e), "kind": type(e).__name__}))
        return 0
    print(json.dumps({}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
