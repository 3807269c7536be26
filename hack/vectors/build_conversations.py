#!/usr/bin/env python3
"""Extract small multi-turn agent conversations for kvgate's prefix tests.

Takes the first messages of a few SWE-agent trajectories (MIT licensed, see
shared/data/swe-agent/LICENSE.SWE-agent.MIT.txt), shortens long contents, and turns some
assistant turns into OpenAI tool calls with tool results, so the tests exercise tools too.

    .venv/bin/python hack/vectors/build_conversations.py \
        --data /work/shared/data/swe-agent --out tests/data/prefix/conversations.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TRAJECTORIES = 4
MESSAGES = 14
MAX_CHARS = 1200


def convert(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending_call: str | None = None
    for index, message in enumerate(history[:MESSAGES]):
        role, content = message["role"], str(message.get("content", ""))[:MAX_CHARS]
        action = message.get("action")
        if role == "assistant" and isinstance(action, str) and index % 4 == 2:
            pending_call = f"call_{index}"
            out.append(
                {
                    "role": "assistant",
                    "content": str(message.get("thought", ""))[:MAX_CHARS] or None,
                    "tool_calls": [
                        {
                            "id": pending_call,
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": json.dumps({"command": action.strip()[:400]}),
                            },
                        }
                    ],
                }
            )
        elif role == "user" and pending_call is not None:
            out.append({"role": "tool", "tool_call_id": pending_call, "content": content})
            pending_call = None
        else:
            out.append({"role": role, "content": content})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    conversations = []
    for path in sorted(args.data.glob("*.traj"))[:TRAJECTORIES]:
        history = json.loads(path.read_text())["history"]
        conversations.append({"source": path.name, "messages": convert(history)})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a shell command in the task's container & return <stdout>.",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string", "description": "the command"}},
                    "required": ["command"],
                },
            },
        }
    ]
    doc = {
        "license": "MIT (SWE-agent trajectories)",
        "tools": tools,
        "conversations": conversations,
    }
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
