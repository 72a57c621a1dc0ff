"""Chat templates (runtime): a conversation rendered by the model's jinja2 template.

The template is artifact data, so it runs in jinja2's immutable sandbox (no attribute access
outside what the sandbox allows, no mutation of what it is given), with the environment
transformers gives chat templates: trim_blocks and lstrip_blocks, the loop-controls extension,
`raise_exception`, `strftime_now` and a `tojson` filter that keeps non-ASCII text.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from aotc.errors import ArtifactError, UsageError


def _raise(message):
    raise UsageError(f"the chat template refused the conversation: {message}",
                     where="chat template", expected="messages the template accepts",
                     found=str(message)[:200], fix="check the roles and their order")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compiled(template: str, where: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise ArtifactError(f"the chat template does not parse: {e}", where=where,
                            expected="a jinja2 template", found=type(e).__name__,
                            fix="re-export from a folder whose chat template is valid") from None


def render(template: str, messages, add_generation_prompt: bool, special: dict,
           where: str) -> str:
    from jinja2 import TemplateError
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise UsageError("messages must be a list of {'role': ..., 'content': ...} dicts",
                         where="apply_chat_template", expected="[{'role': 'user', "
                         "'content': 'Hi'}]", found=repr(messages)[:120],
                         fix="pass a list of role/content dicts, as the OpenAI API does")
    try:
        return _compiled(template, where).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
            documents=None, **special)
    except UsageError:
        raise
    except TemplateError as e:
        raise UsageError(f"the chat template failed on these messages: {e}", where=where,
                         expected="messages the template accepts", found=type(e).__name__,
                         fix="check the messages' roles and fields") from None
