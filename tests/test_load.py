"""Load: eight browser-less clients (`gradio_client`, loopback) run generations on the embedded default at once.
Every one completes, waiting ones see their queue position, every output equals plain decoding's, a client that
presses Run twice gets both, /health answers throughout, and memory stays bounded."""
import html
import json
import re
import threading
import time
from pathlib import Path

import psutil
import requests

OUT = Path(__file__).resolve().parent.parent / "test-output"
PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "What are some good tips for staying focused while studying?"]
METHODS = ["DDTree", "DFlash chain", "PRESTO", "DDTree, auto budget"]
TOKENS = 20


def text_of(rendered: str) -> str:
    body = rendered.split('<div class="tokens">', 1)[1]
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def plain_text(prompt: str) -> str:
    """Plain decoding of the prompt through the app's own handler, in this process."""
    from studio import handlers
    from studio.handlers import Form

    *_, last = handlers.run(Form(prompt, "Plain decoding (AR)", 16, 0.0, 1.0, 0, TOKENS, 0, "smollm2-135m"), None)
    return text_of(last[0])


def test_eight_concurrent_clients(url):
    import app
    from gradio_client import Client
    from gradio_client.utils import Status

    expected = {p: plain_text(p) for p in PROMPTS}
    rss_before = psutil.Process().memory_info().rss
    health, stop = [], threading.Event()

    def poll_health():
        while not stop.is_set():
            t0 = time.perf_counter()
            r = requests.get(url + "health", timeout=10)
            health.append((r.status_code, time.perf_counter() - t0, r.json()))
            time.sleep(0.2)

    watcher = threading.Thread(target=poll_health, daemon=True)
    watcher.start()
    clients = [Client(url, verbose=False) for _ in range(8)]
    started = time.perf_counter()
    jobs = []
    for i, client in enumerate(clients):
        prompt, method = PROMPTS[i % 2], METHODS[i % len(METHODS)]
        jobs.append((prompt, client.submit(prompt, method, 32, 0.0, 1.0, 0, TOKENS, 0, "smollm2-135m",
                                           api_name="/run")))
    # one client presses Run twice: both runs are queued and both complete
    jobs.append((PROMPTS[0], clients[0].submit(PROMPTS[0], "DDTree", 32, 0.0, 1.0, 0, TOKENS, 0, "smollm2-135m",
                                               api_name="/run")))
    ranks = set()
    deadline = time.time() + 600
    while not all(job.done() for _, job in jobs) and time.time() < deadline:
        for _, job in jobs:
            status = job.status()
            if status.code == Status.IN_QUEUE and status.rank is not None:
                ranks.add(status.rank)
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    stop.set()
    watcher.join(timeout=15)
    assert all(job.done() for _, job in jobs), "every client finished within the time bound"
    assert ranks and max(ranks) >= 1                  # waiting clients were told their place in the queue
    for prompt, job in jobs:
        final = job.outputs()[-1]
        assert "τ" in final[3]
        assert text_of(final[0]) == expected[prompt]   # temperature 0: the same text as plain decoding
    assert health and all(code == 200 for code, _, _ in health)
    assert max(seconds for _, seconds, _ in health) < 5.0       # the app answered while the queue was busy
    assert health[-1][2]["status"] == "ok" and health[-1][2]["max_budget"] >= 1
    grown = (psutil.Process().memory_info().rss - rss_before) / 2**20
    OUT.mkdir(exist_ok=True)
    (OUT / "load.json").write_text(json.dumps({
        "clients": 8, "runs": len(jobs), "new_tokens": TOKENS, "seconds": round(elapsed, 1),
        "queue_ranks_seen": sorted(ranks), "health_polls": len(health),
        "health_max_ms": round(1000 * max(s for _, s, _ in health)), "rss_growth_mib": round(grown)}, indent=1))
    assert grown < 400, f"memory grew by {grown:.0f} MiB over nine short runs"
    for client in clients:
        client.close()
