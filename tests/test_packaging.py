"""conf/ ships inside the wheel and is found from an installed package."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.support import ROOT


def test_wheel_contains_conf(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("rlft-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = ["rlft/conf/" + str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")]
    assert len(shipped) > 10
    for f in shipped + ["rlft/cli.py", "rlft/algorithms/losses.py", "rlft/rm/train.py"]:
        assert f in names, f
    # Installed elsewhere, the package finds its own conf/ (no checkout beside it).
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    code = "from rlft.config import conf_dir, group_options; print(conf_dir()); print(group_options('algo'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert str(target) in out.stdout and "grpo" in out.stdout
