"""Training prompts for the drafter: the shared prompt sets (training splits only) plus templated code prompts.

Evaluation sets (GSM8K test, HumanEval, MT-Bench) are never read here; `tests/test_training.py` checks that
no training prompt equals an evaluation prompt, and that the shipped replies answer training prompts only.
"""
from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from core.eval.datasets import MATH_SUFFIX, evaluation_texts, shared_data_dir

TRAIN_FILES = ("gsm8k_train.jsonl", "alpaca_eval.jsonl", "alpaca_seed_tasks.jsonl",
               "self_instruct_user_oriented.jsonl")
EVAL_FILES = ("gsm8k_test.jsonl",)


@dataclass(frozen=True)
class Prompt:
    key: str      # "<source>:<index>", stable across runs (used to resume and to split held-out prompts)
    text: str


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _instruction(row: dict, instance: int = 0) -> str:
    text = row["instruction"].strip()
    instances = row.get("instances") or []
    extra = instances[instance].get("input", "").strip() if instances else ""
    return f"{text}\n\n{extra}" if extra else text


def shared_prompts(data_dir: Path | None = None) -> list[Prompt]:
    d = data_dir or shared_data_dir()
    out = []
    for i, row in enumerate(_read_jsonl(d / "gsm8k_train.jsonl")):
        out.append(Prompt(f"gsm8k_train:{i}", row["question"].strip() + MATH_SUFFIX))
    for name in TRAIN_FILES[1:]:
        for i, row in enumerate(_read_jsonl(d / name)):
            out.append(Prompt(f"{name.removesuffix('.jsonl')}:{i}", _instruction(row)))
    return out


_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "computes the factorial of a number", "finds the largest element in a list", "flattens a nested list",
    "checks whether two strings are anagrams", "converts Celsius to Fahrenheit", "computes the GCD of two integers",
    "sorts a list of dictionaries by a key", "counts word frequencies in a text", "finds the second largest number",
    "checks whether a year is a leap year", "returns the sum of the digits of an integer", "rotates a list by k steps",
    "implements binary search", "implements bubble sort", "implements quicksort", "implements merge sort",
    "transposes a matrix", "multiplies two matrices", "checks whether brackets in a string are balanced",
    "converts a Roman numeral to an integer", "converts an integer to binary", "finds all divisors of a number",
    "returns the longest word in a sentence", "capitalizes the first letter of each word",
    "computes the mean, median and mode of a list", "finds the intersection of two lists",
    "checks whether a list is sorted", "generates all permutations of a string", "computes the power set of a set",
    "finds the missing number in a range", "counts the lines in a text file", "parses a CSV line into fields",
    "validates an email address with a regular expression", "computes the Levenshtein distance",
    "implements a stack class", "implements a queue with two stacks", "implements a linked list",
    "reverses a linked list", "finds the depth of a binary tree", "checks whether a binary tree is balanced",
    "performs a breadth-first search on a graph", "performs a depth-first search on a graph",
    "finds the shortest path with Dijkstra's algorithm", "computes prime numbers with the sieve of Eratosthenes",
    "converts a dictionary to JSON and back", "reads a JSON file and prints its keys",
    "computes the running total of a list", "chunks a list into pieces of size n", "zips two lists into a dictionary",
    "finds the most common element in a list", "checks whether a string is a palindrome",
    "computes compound interest", "returns the n largest numbers", "converts a string to snake_case",
    "converts snake_case to camelCase", "counts the occurrences of a character", "computes the area of a circle",
    "simulates rolling two dice", "shuffles a deck of cards", "implements a simple calculator",
    "checks whether a number is an Armstrong number", "computes the least common multiple",
    "removes punctuation from a string", "finds the longest common prefix of strings",
    "groups words by their first letter", "returns the unique characters in a string",
    "computes the dot product of two vectors", "normalizes a list of numbers", "implements a memoized function",
    "retries a function call with exponential backoff", "measures the run time of a function with a decorator",
    "implements an LRU cache", "validates a Sudoku board", "solves the Tower of Hanoi",
]
_CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "C++", "Java", "Go", "Rust"]
_CODE_FORMS = [
    "Write a {lang} function that {task}.",
    "Write a {lang} function that {task}. Include a short docstring and an example.",
    "Implement a {lang} program that {task}, and explain how it works.",
    "Show me how to write code in {lang} that {task}.",
    "Write a {lang} function that {task}, with unit tests.",
]


def code_prompts(seed: int = 0) -> list[Prompt]:
    """Templated coding requests (no HumanEval text): every task in each language form, deterministic."""
    rng = random.Random(seed)
    out = []
    for i, task in enumerate(_CODE_TASKS):
        for j, form in enumerate(_CODE_FORMS):
            lang = _CODE_LANGS[rng.randrange(len(_CODE_LANGS))]
            out.append(Prompt(f"code:{i}.{j}", form.format(lang=lang, task=task)))
    return out


def training_prompts(seed: int = 0, data_dir: Path | None = None) -> list[Prompt]:
    """All training prompts, shuffled deterministically so that any prefix of the list mixes every source.
    Prompts that also appear in an evaluation set are dropped (AlpacaEval contains some MT-Bench questions)."""
    banned = evaluation_texts()
    prompts = [p for p in shared_prompts(data_dir) + code_prompts(seed) if _bare(p.text) not in banned]
    random.Random(seed).shuffle(prompts)
    return prompts


def _bare(text: str) -> str:
    return text.split(MATH_SUFFIX)[0].strip()


def round_key(key: str, round_: int) -> str:
    """The key of a prompt's reply in generation round `round_`: round 1 keeps the prompt's own key, later rounds
    (another, sampled reply to the same prompt) append `#r<round>`."""
    return key if round_ <= 1 else f"{key}#r{round_}"


def prompt_key(key: str) -> str:
    """The prompt a reply key answers, whatever its round."""
    return key.split("#r")[0]


def is_held_out(key: str, every: int = 50) -> bool:
    """A fixed 2% of training-source prompts kept out of training, for measuring tau during training (every round
    of a held-out prompt is held out with it)."""
    return zlib.crc32(prompt_key(key).encode()) % every == 0
