"""The built-in evaluation set: what `quality: {}` runs when the spec names no evalSet.

Short items SmolLM2-135M-Instruct (the default model) answers right greedily: factual
questions checked with `contains`, arithmetic and counts with a regex, a JSON answer with a schema;
six facts stated only in a system turn (the model answers them only when it sees that turn);
and two long-context retrieval items, a fact placed ~1.1k and ~1.5k tokens before its question
(position bugs such as a wrong rope_theta hide in short prompts). Every item was kept only after
the real model passed it greedily (transformers, float32, its own chat template): docs/design.md
("The quality gate") records the run. Its digest is computed, never written by hand, and shown in
status.lastQuality.digest; changing an item changes the digest.
"""

from __future__ import annotations

from typing import Any

from modeldeploy.operator.api.v1alpha1.quality import EvalItem

# Neutral filler for the long-context items: sentences that mention no password or number asked for.
FILLER = (
    "The morning train left the station on time and crossed the river bridge.",
    "A farmer in the valley grows apples, pears and a few rows of cabbages.",
    "The library on the hill opens at nine and closes at six every weekday.",
    "Children played football in the park while their parents talked nearby.",
    "The old lighthouse was painted white with a red stripe near the top.",
    "A baker on the corner sells bread, rolls and cinnamon buns each morning.",
    "The museum added a new room for ancient coins and pottery last spring.",
    "Rain fell softly on the roofs of the village for most of the afternoon.",
    "The harbour was full of small fishing boats with blue and green hulls.",
    "A cyclist rode along the coastal path and stopped to watch the waves.",
    "The school choir practised three new songs for the winter concert.",
    "In the market, a woman sold honey, candles and hand-knitted scarves.",
)


def _filler(sentences: int) -> str:
    return " ".join(FILLER[i % len(FILLER)] for i in range(sentences))


def _ask(prompt: str, **check: Any) -> dict[str, Any]:
    return {"prompt": prompt, "maxTokens": 24, **check}


def _told(system: str, question: str, **check: Any) -> dict[str, Any]:
    """A fact given only in the system turn: a template or server that loses the system message
    (a tokenizer revision whose chat template drops it) cannot answer these."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"messages": msgs, "maxTokens": 24, **check}


def _recall(fact: str, question: str, answer_regex: str, sentences: int) -> dict[str, Any]:
    """A fact, `sentences` filler sentences (~15 tokens each), then the question about the fact."""
    text = f"{fact} {_filler(sentences)}\n\nQuestion: {question} Answer briefly."
    return {"messages": [{"role": "user", "content": text}], "maxTokens": 24, "regex": answer_regex}


_ITEMS: tuple[dict[str, Any], ...] = (
    _ask("What is the capital of France?", contains="Paris"),
    _ask("What is the capital of Japan?", contains="Tokyo"),
    _ask("What is the capital of Germany?", contains="Berlin"),
    _ask("What is the capital of England?", contains="London"),
    _ask("What is the capital of Canada?", contains="Ottawa"),
    _ask("What is the capital of Russia?", contains="Moscow"),
    _ask("What is the capital of China?", contains="Beijing"),
    _ask("Who wrote Romeo and Juliet?", contains="Shakespeare"),
    _ask("What color is the sky on a clear day?", contains="blue"),
    _ask("How many days are there in a week?", regex=r"(?i)\b(7|seven)\b"),
    _ask("What is 2 + 2?", regex=r"\b4\b"),
    _ask("What is 3 times 3?", regex=r"\b9\b"),
    _ask("What is the chemical formula of water?", contains="H2O"),
    _ask("Which gas do plants absorb from the air for photosynthesis?", contains="carbon dioxide"),
    _ask("Who painted the Mona Lisa?", contains="Leonardo"),
    _ask("What language is spoken in Brazil?", contains="Portuguese"),
    _ask("What is the largest ocean on Earth?", contains="Pacific"),
    _ask("What is the opposite of hot?", contains="cold"),
    _ask("What is the tallest mountain in the world?", contains="Everest"),
    _ask("How do you say hello in Spanish?", contains="hola"),
    _ask("Which planet is known as the Red Planet?", contains="Mars"),
    _ask("What is the boiling point of water in degrees Celsius?", regex=r"\b100\b"),
    _ask("What is the main language spoken in France?", contains="French"),
    _ask("Repeat after me exactly: good morning", regex=r"(?i)good morning"),
    {
        "prompt": 'Return a JSON object with a "name" key set to "Alice" and an "age" key set to 30. '
        "Reply with JSON only.",
        "maxTokens": 32,
        "jsonSchema": {
            "type": "object",
            "required": ["name", "age"],
            "properties": {"name": {"type": "string", "enum": ["Alice"]}, "age": {"type": "integer"}},
        },
    },
    {
        "prompt": 'Reply in JSON with a key "answer" holding the result of 2 + 3 as a number.',
        "maxTokens": 40,
        "jsonSchema": {
            "type": "object",
            "required": ["answer"],
            "properties": {"answer": {"type": "integer", "minimum": 5, "maximum": 5}},
        },
    },
    _told("The secret code is 5521.", "What is the secret code?", regex=r"\b5521\b"),
    _told("The user's name is Maria.", "What is my name?", contains="Maria"),
    _told(
        "The capital of the fictional country Zorbia is Quenta.",
        "What is the capital of Zorbia?",
        contains="Quenta",
    ),
    _told("The password for the wifi is sunflower42.", "What is the wifi password?", contains="sunflower42"),
    _told("Today is Friday.", "What day is it today?", contains="Friday"),
    _told("The package weighs 12 kilograms.", "How much does the package weigh?", regex=r"\b12\b"),
    _recall("Note: the meeting room number is 417.", "What is the meeting room number?", r"\b417\b", 70),
    _recall("My cat is called Whiskers.", "What is my cat called?", r"(?i)whiskers", 100),
)

DEFAULT_ITEMS: tuple[EvalItem, ...] = tuple(EvalItem.model_validate(i) for i in _ITEMS)
