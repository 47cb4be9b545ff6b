#!/usr/bin/env python3
"""Renders testdata/template_cases.json with Python jinja2 exactly as HF transformers'
apply_chat_template does, and writes testdata/template_expected.json.

The Rust test `template_cases` renders the same cases with gyre-proxy's minijinja setup and
compares byte for byte. Re-run after editing the cases:

    python3 crates/proxy/testdata/jinja2_reference.py

`--dir DIR` does the same for a case set kept elsewhere (e.g. real model templates that cannot
be committed); point GYRE_PROXY_TEMPLATE_CASES at DIR to have `cargo test` compare it too.

Needs only `jinja2` (tested with 3.1.6). The environment mirrors
transformers/utils/chat_template_utils.py: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]), the `tojson` override, and the
`raise_exception` / `strftime_now` globals. `strftime_now` uses a fixed date (the Rust side gets
the same date as an input).
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = datetime.datetime(2026, 12, 2, 9, 5, 7)


class AssistantTracker(Extension):
    """transformers' {% generation %} block: renders its body (span tracking left out)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return NOW.strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    directory = HERE
    if len(sys.argv) == 3 and sys.argv[1] == "--dir":
        directory = os.path.abspath(sys.argv[2])
    with open(os.path.join(directory, "template_cases.json")) as f:
        cases = json.load(f)
    env = environment()
    expected = {}
    for case in cases:
        if "template_file" in case:
            with open(os.path.join(directory, case["template_file"])) as f:
                source = f.read()
        else:
            source = case["template"]
        try:
            expected[case["name"]] = {"output": env.from_string(source).render(**case["context"])}
        except jinja2.exceptions.TemplateError as error:
            expected[case["name"]] = {"error": str(error)}
    with open(os.path.join(directory, "template_expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"jinja2 {jinja2.__version__}: {len(expected)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
