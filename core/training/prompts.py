"""Training prompts for the drafter: the shared prompt sets (training splits only), templated code prompts, coding
requests made from the standard library's and numpy's documented functions, templated science and math problems, and
the training splits of MATH, MBPP, ARC and QASC, Dolly's records that need no context, OASST1's first turns,
PubMedQA's questions outside its test split, OpenStax's physics and chemistry exercises and GPTeacher's coding and
role-play requests (`assets/training_prompts/`, their sources and licences in its README).

Evaluation sets (GSM8K test, HumanEval, MT-Bench) are never read here; `tests/test_training.py` checks that
no training prompt equals an evaluation prompt, and that the shipped replies answer training prompts only.
"""
from __future__ import annotations

import gzip
import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from core.eval.datasets import MATH_SUFFIX, REPO_ROOT, evaluation_texts, shared_data_dir

TRAIN_FILES = ("gsm8k_train.jsonl", "alpaca_eval.jsonl", "alpaca_seed_tasks.jsonl",
               "self_instruct_user_oriented.jsonl")
EVAL_FILES = ("gsm8k_test.jsonl",)


@dataclass(frozen=True)
class Prompt:
    key: str      # "<source>:<index>", stable across runs (used to resume and to split held-out prompts)
    text: str


def _read_jsonl(path: Path) -> list[dict]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
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


# Modules and classes whose documented functions become coding requests: the standard library and numpy (pinned in
# requirements.txt), so the same keys give the same prompts wherever the project installs.
_API_MODULES = (
    "string textwrap os.path shutil json re math statistics itertools functools collections heapq calendar difflib "
    "html urllib.parse base64 hashlib fnmatch glob ipaddress copy pprint shlex secrets unicodedata email.utils "
    "tokenize ast inspect typing posixpath quopri binascii locale platform sysconfig tempfile filecmp mimetypes "
    "wsgiref.util http.cookiejar xml.sax.saxutils numpy").split()
_API_CLASSES = ("builtins.str builtins.bytes builtins.list builtins.dict builtins.set builtins.int builtins.float "
                "collections.Counter collections.deque datetime.date datetime.datetime datetime.timedelta "
                "fractions.Fraction pathlib.PurePath random.Random decimal.Decimal difflib.SequenceMatcher "
                "textwrap.TextWrapper").split()
API_FORMS = (
    "Write a Python function `{name}{sig}` that does what this summary says, without using `{owner}`: {summary}",
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
    "def {name}{sig}:\n    \"\"\"{doc}\n    \"\"\"\n```",
    "Implement `{name}{sig}` in Python ({summary}) and show two example calls with their results.",
)


def _documented(owner, prefix: str):
    """(qualified name, callable) for the public functions of a module or methods of a class with a docstring whose
    first line says something and a signature Python can state."""
    import inspect

    for name, f in sorted(vars(owner).items()):
        if name.startswith("_") or not (inspect.isroutine(f) or isinstance(f, (classmethod, staticmethod))):
            continue
        f = getattr(owner, name)
        if inspect.ismodule(owner) and getattr(f, "__module__", None) not in (owner.__name__, None):
            continue
        doc = inspect.getdoc(f) or ""
        if len(doc.split("\n")[0]) < 20:
            continue
        try:
            sig = inspect.signature(f)
        except (TypeError, ValueError):
            continue
        yield f"{prefix}.{name}", name, sig, doc


def api_prompts() -> list[Prompt]:
    """Coding requests made from the documented functions and methods of the standard library and numpy: write
    the function its signature and docstring describe (one of three forms, one a benchmark-style problem)."""
    import importlib
    import inspect
    import sys
    import sysconfig

    machine = {sys.executable: "sys.executable", sysconfig.get_default_scheme(): "get_default_scheme()"}
    owners = [(importlib.import_module(m), m) for m in _API_MODULES]
    for path in _API_CLASSES:
        module, cls = path.rsplit(".", 1)
        owners.append((getattr(importlib.import_module(module), cls), path.removeprefix("builtins.")))
    out = []
    for owner, prefix in owners:
        for key, name, sig, doc in _documented(owner, prefix):
            this = "obj" if "value" in sig.parameters else "value"
            params = [_by_name(p.replace(name=this) if p.name == "self" else p, machine)
                      for p in sig.parameters.values() if p.name != "cls"]
            sig = str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))
            summary = doc.split("\n\n")[0].replace("\n", " ").strip()
            body = "\n    ".join(doc.split("\n\n")[0].splitlines()[:12])
            form = API_FORMS[zlib.crc32(key.encode()) % len(API_FORMS)]
            out.append(Prompt(f"api:{key}", form.format(name=name, sig=sig, owner=prefix, summary=summary[:400],
                                                        doc=body)))
    return out


class _Name(str):
    def __repr__(self) -> str:
        return str(self)


def _by_name(param, machine: dict[str, str]):
    """A parameter whose default prints its address (a function, a bound method) or this machine (`machine`: the
    Python executable, the venv's install scheme, by name) with a name instead: the same prompt text in every process
    and place."""
    if isinstance(param.default, str) and param.default in machine:
        return param.replace(default=_Name(machine[param.default]))
    if " at 0x" not in repr(param.default):
        return param
    name = getattr(param.default, "__name__", "...")
    return param.replace(default=_Name("..." if name.startswith("<") else name))


_SCIENCE = (
    "photosynthesis", "cellular respiration", "mitosis and meiosis", "natural selection", "DNA replication",
    "the immune response to a virus", "enzymes and activation energy", "osmosis", "the nitrogen cycle",
    "plate tectonics", "the rock cycle", "the water cycle", "the greenhouse effect", "ocean tides", "the seasons",
    "the phases of the Moon", "black holes", "the life cycle of a star", "the Doppler effect", "Newton's laws of motion",
    "conservation of energy", "conservation of momentum", "friction", "buoyancy", "pressure in fluids",
    "electric current and voltage", "Ohm's law", "magnetic fields", "electromagnetic induction", "light refraction",
    "the photoelectric effect", "radioactive decay and half-life", "nuclear fission and fusion", "entropy",
    "the ideal gas law", "heat conduction, convection and radiation", "specific heat capacity", "sound waves",
    "the periodic table", "ionic and covalent bonds", "acids, bases and pH", "oxidation and reduction",
    "chemical equilibrium", "reaction rates and catalysts", "isotopes", "moles and Avogadro's number",
    "polymers", "the structure of the atom", "electronegativity", "the speed of light",
    "special relativity", "quantum tunnelling", "semiconductors", "superconductivity", "the Big Bang",
    "gravitational waves", "vaccines", "antibiotic resistance", "the human heart", "neurons and synapses",
    "hormones", "ecosystems and food webs", "biodiversity", "the carbon cycle", "climate and weather",
    "earthquakes", "volcanoes", "erosion", "the ozone layer", "renewable energy sources", "batteries",
    "transistors", "how a computer stores numbers", "the scientific method", "statistical significance",
    "the central limit theorem", "exponential growth", "probability of independent events", "vectors",
    "derivatives", "integrals", "prime numbers", "the Pythagorean theorem", "complex numbers", "logarithms",
)
_SCIENCE_FORMS = (
    "Explain {topic} to a high-school student.",
    "What is {topic}? Give a short definition and one everyday example.",
    "Answer the following science question and explain your reasoning step by step: what role does {topic} play, "
    "and how would you demonstrate it with a simple experiment?",
    "Write three multiple-choice questions about {topic}, each with four options, and give the correct answers.",
)


def science_prompts() -> list[Prompt]:
    """Templated science and mathematics explanations and questions (no evaluation set's text)."""
    return [Prompt(f"science:{i}.{j}", form.format(topic=topic))
            for i, topic in enumerate(_SCIENCE) for j, form in enumerate(_SCIENCE_FORMS)]


_MATH_FORMS = (
    "Solve for x: {a}x + {b} = {c}.", "Find the greatest common divisor of {a}{b} and {c}{a}.",
    "How many positive divisors does {a}{c} have?", "What is the remainder when {a}^{b} is divided by {c}?",
    "Compute the sum of the first {a}{b} positive odd integers.", "Find all real x such that x^2 - {a}x + {b} = 0.",
    "How many ways can {a} books be arranged on a shelf if {b} particular books must stay together?",
    "A fair die is rolled {a} times. What is the probability that a {b} appears exactly twice?",
    "Find the area of a triangle with vertices (0, 0), ({a}, {b}) and ({c}, 1).",
    "What is the smallest positive integer n such that {a}n leaves remainder {b} when divided by {c}{a}?",
    "Evaluate the sum 1/(1*2) + 1/(2*3) + ... + 1/({a}{b}*{a}{b}1).",
    "If f(x) = {a}x^2 + {b}x + {c}, find f(f(1)).",
    "Find the number of integers between 1 and {a}{b}{c} that are divisible by {a} or {c}.",
    "The arithmetic sequence {a}, {a}{b}, ... has common difference {a}{b}-{a}. What is its {c}0th term?",
)


def math_prompts(seed: int = 0) -> list[Prompt]:
    """Competition-style arithmetic, algebra, counting and probability problems with random numbers, in the
    benchmarks' math format (MATH_SUFFIX)."""
    rng = random.Random(seed + 7)
    return [Prompt(f"math:{i}.{j}", form.format(a=rng.randint(2, 9), b=rng.randint(1, 9), c=rng.randint(3, 9))
                   + MATH_SUFFIX) for i, form in enumerate(_MATH_FORMS) for j in range(12)]


PROMPT_ASSETS = REPO_ROOT / "assets" / "training_prompts"


def _mbpp(row: dict) -> str:
    """MBPP's own prompt: the task, then the asserts the function must pass."""
    return row["text"].strip() + " Your code should pass these tests:\n\n" + "\n".join(row["test_list"])


def _request(text: str, requests: tuple, row_id: str, sep: str = " ") -> str:
    """`text`, then one of `requests` after `sep` (none when the pick is ""), picked by a hash of the row's id, so a
    key always rebuilds the same prompt."""
    request = requests[zlib.crc32(row_id.encode()) % len(requests)]
    return text + (f"{sep}{request}" if request else "")


_ARC_REQUESTS = ("Explain your reasoning, then give the correct answer.", "Which choice is correct, and why?", "")


def _lettered(stem: str, choices: list[dict]) -> str:
    """A multiple-choice question as an exam prints it: the stem, then one lettered choice a line."""
    return stem.strip() + "\n\n" + "\n".join(f"{c['label']}. {c['text'].strip()}" for c in choices)


def _arc(row: dict) -> str:
    """An ARC question as a science exam prints it, then one of three requests (picked by the question's id, so a
    key always rebuilds the same prompt)."""
    return _request(_lettered(row["question"]["stem"], row["question"]["choices"]), _ARC_REQUESTS, row["id"],
                    sep="\n\n")


_QASC_REQUESTS = ("Explain your answer.", "Explain why in a few sentences.", "")


def _qasc(row: dict) -> str:
    """A QASC question as written, then one of three requests (picked by its id, as for ARC): the questions are
    terse, and a reply that explains is the kind a science question gets."""
    return _request(row["question"], _QASC_REQUESTS, row["id"])


def _with_input(row: dict) -> str:
    """An instruction and, when it has one, its input (code, a passage, a scenario) after a blank line."""
    return row["instruction"] + (f"\n\n{row['input']}" if row["input"] else "")


_PUBMEDQA_REQUESTS = ("Answer yes, no or maybe, then explain why.", "What does the evidence say?", "")


def _pubmedqa(row: dict) -> str:
    """A biomedical research question (a paper's title, as a question) without its abstract, then one of three
    requests (picked by its PubMed id, as for ARC): the reply must come from what the model knows."""
    return _request(row["question"], _PUBMEDQA_REQUESTS, row["pmid"])


_TAL_REQUESTS = (MATH_SUFFIX.strip(), "Explain your reasoning, then give the correct answer.", "")


def _tal(row: dict) -> str:
    """A TAL-SCQ5K competition problem with its lettered choices one a line (as ARC's), then one of three requests
    (picked by its id, as for ARC), the first the benchmarks' boxed format."""
    return _request(_lettered(row["problem"], row["choices"]), _TAL_REQUESTS, row["queId"], sep="\n\n")


_NL2BASH_REQUESTS = ("Write the bash command.", "Give a shell command that does this, and explain it briefly.", "")


def _nl2bash(row: dict) -> str:
    """An NL2Bash description of a shell task, then one of three requests (picked by its line, as for ARC)."""
    text = row["text"] if row["text"][-1] in ".?!" else row["text"] + "."
    return _request(text, _NL2BASH_REQUESTS, str(row["line"]))


# OpenStax textbooks whose text-only exercises are committed, one file each (`openstax_<book>.jsonl.gz`)
OPENSTAX_BOOKS = ("physics", "chemistry", "university_physics", "astronomy", "microbiology", "anatomy_physiology",
                  "algebra", "prealgebra", "statistics", "biology")
# Committed training splits: key prefix -> (file in PROMPT_ASSETS, prompt from a row). Keys index the file's rows.
ASSET_SETS = {
    "math_train": ("math_train.jsonl.gz", lambda row: row["problem"].strip() + MATH_SUFFIX),
    "mbpp_train": ("mbpp_train.jsonl.gz", _mbpp),
    "arc_train": ("arc_train.jsonl.gz", _arc),
    "dolly_open_qa": ("dolly_open_qa.jsonl.gz", lambda row: row["instruction"].strip()),
    "dolly_no_context": ("dolly_no_context.jsonl.gz", lambda row: row["instruction"]),
    "qasc_train": ("qasc_train.jsonl.gz", _qasc),
    "oasst1_en": ("oasst1_en.jsonl.gz", lambda row: row["text"]),
    "gpteacher_code": ("gpteacher_code.jsonl.gz", _with_input),
    "gpteacher_roleplay": ("gpteacher_roleplay.jsonl.gz", _with_input),
    "pubmedqa": ("pubmedqa.jsonl.gz", _pubmedqa),
    **{f"openstax_{book}": (f"openstax_{book}.jsonl.gz", lambda row: row["problem"]) for book in OPENSTAX_BOOKS},
    "chat_rl_prompts": ("chat_rl_prompts.jsonl.gz", lambda row: row["prompt"]),
    "tal_scq5k_train": ("tal_scq5k_train.jsonl.gz", _tal),
    "exercism": ("exercism.jsonl.gz", lambda row: f"{row['text']}\n\nWrite a solution in {row['language']}."),
    "nl2bash": ("nl2bash.jsonl.gz", _nl2bash),
}


def asset_prompts() -> list[Prompt]:
    """Competition problems (MATH's training split, in the benchmarks' boxed format), Python tasks (MBPP's
    training split, tasks 601-974), school science questions (ARC's training splits, multiple choice; QASC's
    training split, open; PubMedQA's biomedical research questions outside its test split; the text-only
    exercises of OpenStax's physics, university physics, chemistry, astronomy, microbiology, anatomy and
    physiology and biology textbooks), exercises of its algebra, precalculus and statistics textbooks (the math in
    LaTeX) and requests to a chat assistant (Dolly's open_qa, and its other records that need no
    context: brainstorming, general questions, creative writing, classification; OASST1's English first turns;
    more first turns from OASST2, HelpSteer2, Anthropic's HH-RLHF and Capybara; TAL-SCQ5K's multiple-choice
    competition problems, training split; Exercism's programming exercises, each asked in five languages; NL2Bash's
    shell tasks): the kinds of prompt the templates imitate, written by people. Beside them, GPTeacher's coding tasks
    in many languages and its role-play requests, written by GPT-4 (the instructions only)."""
    out = []
    for name, (file, prompt) in ASSET_SETS.items():
        out += [Prompt(f"{name}:{i}", prompt(row)) for i, row in enumerate(_read_jsonl(PROMPT_ASSETS / file))]
    return out


def training_prompts(seed: int = 0, data_dir: Path | None = None) -> list[Prompt]:
    """All training prompts, shuffled deterministically so that any prefix of the list mixes every source.
    Prompts that also appear in an evaluation set are dropped (AlpacaEval contains some MT-Bench questions)."""
    banned = evaluation_texts()
    prompts = (shared_prompts(data_dir) + code_prompts(seed) + api_prompts() + science_prompts() + math_prompts(seed)
               + asset_prompts())
    prompts = [p for p in prompts if _bare(p.text) not in banned]
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


def prompt_source(key: str) -> str:
    """The prompt set a prompt or reply key comes from (`gsm8k_train`, `code`, ...)."""
    return key.split(":")[0]


def is_held_out(key: str, every: int = 50) -> bool:
    """A fixed 2% of training-source prompts kept out of training, for measuring tau during training (every round
    of a held-out prompt is held out with it)."""
    return zlib.crc32(prompt_key(key).encode()) % every == 0
