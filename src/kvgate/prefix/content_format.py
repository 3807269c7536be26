"""Does a chat template take message content as a string or as a list of OpenAI parts?

vLLM decides this per template (``--chat-template-content-format auto``) by reading the
template's syntax tree: if the template loops over a message's ``content``, it gets content as
a list of ``{"type": "text", "text": ...}`` parts (``"openai"``); otherwise text parts are
joined into one string (``"string"``). kvgate applies the same rule:

1. *message variables* are the targets of ``{% for m in X %}`` loops where ``X`` is
   ``messages``, a slice/filter of it, or a variable (or namespace attribute) assigned from it;
2. the template takes ``"openai"`` content when some ``for`` loop iterates over
   ``m.content`` / ``m['content']`` of a message variable, over a macro parameter that
   receives such a value, or (outside macros) over a variable named ``content``.

Anything else, including a template that does not parse, is ``"string"``.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

import jinja2
import jinja2.nodes as n

ContentFormat = Literal["string", "openai"]


def _dotted(node: n.Node) -> str | None:
    """``x`` for a name, ``ns.attr`` for an attribute of a name (namespace aliases)."""
    if isinstance(node, n.Name):
        return node.name
    if isinstance(node, n.NSRef):
        return f"{node.name}.{node.attr}"
    if isinstance(node, n.Getattr) and isinstance(node.node, n.Name):
        return f"{node.node.name}.{node.attr}"
    return None


def _refers_to(node: n.Node, names: set[str]) -> bool:
    """Whether ``node`` is one of ``names``, or a filter, test, slice or index of one."""
    current: n.Node | None = node
    while isinstance(current, (n.Filter, n.Test, n.Getitem)):
        current = current.node
    if current is None:
        return False
    dotted = _dotted(current)
    return dotted is not None and dotted in names


def _content_of(node: n.Node, message_vars: set[str]) -> bool:
    """``m.content`` / ``m['content']`` (possibly filtered) for a message variable ``m``."""
    current: n.Node | None = node
    while isinstance(current, (n.Filter, n.Test)):
        current = current.node
    if isinstance(current, n.Getattr) and current.attr == "content":
        return _refers_to(current.node, message_vars)
    if isinstance(current, n.Getitem) and isinstance(current.arg, n.Const):
        return current.arg.value == "content" and _refers_to(current.node, message_vars)
    return False


def _aliases(root: n.Template, name: str) -> set[str]:
    """``name`` and every variable or namespace attribute assigned from it, transitively."""
    found = {name}
    queue = deque([name])
    while queue:
        current = {queue.popleft()}
        for assign in root.find_all(n.Assign):
            targets: list[str] = []
            value = assign.node
            if _refers_to(value, current):
                dotted = _dotted(assign.target)
                if dotted is not None:
                    targets.append(dotted)
            elif (
                isinstance(value, n.Call)
                and isinstance(value.node, n.Name)
                and value.node.name == "namespace"
                and isinstance(assign.target, n.Name)
            ):
                targets += [
                    f"{assign.target.name}.{kw.key}"
                    for kw in value.kwargs
                    if _refers_to(kw.value, current)
                ]
            for target in targets:
                if target not in found:
                    found.add(target)
                    queue.append(target)
    return found


def _loop_targets(loop: n.For) -> set[str]:
    target = loop.target
    if isinstance(target, n.Name):
        return {target.name}
    if isinstance(target, n.Tuple):
        return {item.name for item in target.items if isinstance(item, n.Name)}
    return set()


def detect_content_format(source: str, env: jinja2.Environment) -> ContentFormat:
    try:
        root = env.parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    messages = _aliases(root, "messages")
    message_vars: set[str] = set()
    for loop in root.find_all(n.For):
        if _refers_to(loop.iter, messages):
            message_vars |= _loop_targets(loop)
    loops_in_macros: dict[int, set[str]] = {}
    for macro in root.find_all(n.Macro):
        params = {arg.name for arg in macro.args}
        receiving: set[str] = set()
        for call in root.find_all(n.Call):
            if not (isinstance(call.node, n.Name) and call.node.name == macro.name):
                continue
            for arg, param in zip(call.args, macro.args, strict=False):
                if _content_of(arg, message_vars):
                    receiving.add(param.name)
            for kw in call.kwargs:
                if kw.key in params and _content_of(kw.value, message_vars):
                    receiving.add(kw.key)
        for loop in macro.find_all(n.For):
            loops_in_macros[id(loop)] = receiving
    for loop in root.find_all(n.For):
        iterated = loop.iter
        if _content_of(iterated, message_vars):
            return "openai"
        if isinstance(iterated, n.Name):
            in_macro = loops_in_macros.get(id(loop))
            if in_macro is not None and iterated.name in in_macro:
                return "openai"
            if in_macro is None and iterated.name == "content":
                return "openai"
    return "string"
