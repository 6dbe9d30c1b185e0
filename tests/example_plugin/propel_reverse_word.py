"""An example third-party propel domain: the generator proposes a word, the solver reverses it.

docs/writing_plugins.md builds this package step by step.
"""

import re

from propel_core import Context, Domain, ParseError, Validity, Verdict, hookimpl


@hookimpl
def register_domains(register):
    register("reverse_word", ReverseWord)


@hookimpl
def register_validity_predicates(register):
    register("word_length", word_length)


EXAMPLES = ("garden", "planet", "silver", "window")


class ReverseWord(Domain):
    validity_predicates = ("word_length",)

    def __init__(self, min_letters=5, max_letters=12):
        self.min_letters, self.max_letters = min_letters, max_letters

    def contexts(self):
        return [Context(id=f"letter-{c}", data={"letter": c}) for c in "abcdefghij"]

    def generator_prompt(self, context):
        letter = context.data["letter"]
        examples = "\n".join(f"Word: {word}" for word in EXAMPLES if word[0] != letter)
        return [
            {
                "role": "user",
                "content": f"Write one English word of {self.min_letters} to {self.max_letters} letters "
                f"that starts with '{letter}'. Examples:\n{examples}\nReply in the same format.",
            },
            {"role": "assistant", "content": "Word:"},  # a prefill: the model goes on from here
        ]

    def parse(self, generation):
        match = re.search(r"[A-Za-z]+", generation.removeprefix("Word:"))
        if match is None:
            raise ParseError("no word in the generation")
        return {"word": match.group(0).lower()}

    def render(self, payload):
        return f"Reverse the letters of the word: {payload['word']}"

    def solver_prompt(self, payload):
        return [{"role": "user", "content": self.render(payload) + "\nReply with the reversed word only."}]

    def grade(self, payload, attempt):
        words = re.findall(r"[A-Za-z]+", attempt)
        if not words:
            return Verdict(False, "no word in the answer")
        solved = words[0].lower() == payload["word"][::-1]
        return Verdict(solved, None if solved else "wrong reversal")

    def topic(self, payload):
        return payload["word"][0]


def word_length(task, domain):
    length = len(task.payload["word"])
    if domain.min_letters <= length <= domain.max_letters:
        return Validity.ok()
    return Validity.reject(f"{length} letters, outside {domain.min_letters}..{domain.max_letters}")
