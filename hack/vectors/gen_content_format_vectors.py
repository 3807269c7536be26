#!/usr/bin/env python3
"""Record vLLM's own chat-template content-format detection for kvgate's test templates.

Extracts vLLM's AST helpers (``_is_var_access`` ... ``_iter_nodes_assign_content_item``) from
``vllm/renderers/hf.py`` in the vLLM wheel (without importing the module, which needs torch),
parses each template with transformers' Jinja environment as vLLM does, and writes
``{"file.jinja": "string" | "openai"}``.

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm
    .venv/bin/python hack/vectors/gen_content_format_vectors.py \
        --wheel /tmp/vllm/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl \
        --templates tests/data/prefix/templates tests/data/prefix/tokenizer/tokenizer_config.json \
        --out tests/data/prefix/templates/content_formats.json
"""

from __future__ import annotations

import argparse
import ast
import json
import zipfile
from collections import deque
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes
from transformers.utils.chat_template_utils import _compile_jinja_template

FUNCTIONS = {
    "_is_var_access",
    "_is_attr_access",
    "_is_var_or_elems_access",
    "_attr_dotted_name",
    "_iter_nodes_assign_var_or_elems",
    "_iter_nodes_assign_messages_item",
    "_iter_nodes_assign_content_item",
}


def load_detector(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("vllm/renderers/hf.py").decode()
    tree = ast.parse(source)
    picked = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in FUNCTIONS]
    missing = FUNCTIONS - {n.name for n in picked}
    if missing:
        raise SystemExit(f"vLLM's hf.py no longer defines {sorted(missing)}")
    namespace: dict[str, Any] = {"jinja2": jinja2, "deque": deque}
    exec(compile(ast.Module(body=picked, type_ignores=[]), "<vllm hf.py>", "exec"), namespace)

    def detect(template: str) -> str:  # vLLM's _detect_content_format(default="string")
        parsed = _compile_jinja_template(template).environment.parse(template)
        try:
            next(namespace["_iter_nodes_assign_content_item"](parsed))
        except StopIteration:
            return "string"
        return "openai"

    return detect


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--templates", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    detect = load_detector(args.wheel)
    results: dict[str, str] = {}
    for path in args.templates:
        files = sorted(path.glob("*.jinja")) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".json":
                template = json.loads(file.read_text())["chat_template"]
            else:
                template = file.read_text()
            results[file.name] = detect(template)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
