"""Qwen3-Omni's chat template, shipped as package data: the tiny and dummy tokenizers carry it, so
transformers' `apply_chat_template` renders their prompts as the real checkpoint's does.

It is data, not code: `qwen3_omni_chat_template.jinja` beside this module is the Jinja source
(the checkpoint's `chat_template.json`, unescaped). `PromptBuilder` builds the same layout from
token ids; the tests compare the two token for token.
"""

from __future__ import annotations

from importlib import resources

TEMPLATE_FILE = "qwen3_omni_chat_template.jinja"


def qwen3_omni_chat_template() -> str:
    """The template's Jinja source (without the file's final newline, which is no part of it)."""
    source = resources.files("omnivoice.models").joinpath(TEMPLATE_FILE).read_text(encoding="utf-8")
    return source.rstrip("\n")
