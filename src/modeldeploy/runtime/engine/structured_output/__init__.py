"""Constrained decoding: JSON Schema and structural tags compiled by xgrammar (`grammar`), string
limits written as EBNF (`grammar_regex`, over the regex parser `regex_syntax`), the bounds checked
before a compile (`limits`, torch-free for the server) and the thread compiles run on
(`compile_pool`). May import `core`, `output` and `sampling_params`.
"""
