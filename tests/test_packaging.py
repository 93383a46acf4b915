"""batchlab installs as a normal package, not only in editable mode: its data files come along."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_plain_install_has_its_data_files(tmp_path):
    # Build from a copy, so the build leaves nothing behind in this checkout.
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "batchlab", src / "batchlab", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, cwd=tmp_path)
    code = (
        "import batchlab.workloads as w\n"
        "from pathlib import Path\n"
        "assert Path(w.__file__).resolve().is_relative_to(Path(r'%s').resolve()), w.__file__\n"
        "corpus = w.CorpusPrompts(lambda text: [len(word) for word in text.split()])\n"
        "reqs = w.make_workload(3, prompt_len=5, output_len=2, arrival='at_once', prompt_source=corpus)\n"
        "assert all(len(r.prompt_ids) == 5 for r in reqs)\n"
        "from batchlab.shapes import load_model_shapes\n"
        "from batchlab.steptime.roofline import load_device_presets\n"
        "assert 'Llama-3-8B' in load_model_shapes() and 'H100' in ' '.join(load_device_presets())\n"
        "print(w.CORPUS_PATH)\n" % target)
    # Run from an empty folder with only the installed copy on the path (not this checkout).
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    corpus = Path(out.stdout.strip())
    assert corpus.is_file() and corpus.resolve().is_relative_to(target.resolve())
