"""Text normalization speed: characters per second on short and on long texts.

Usage: ``python -m benchmarks.bench_text [--qwen-dir DIR] [--long-chars 5000] [--repeat 3]``.

Four figures for each of short (one or two sentences) and long (``--long-chars``) texts, English
and Chinese mixed, with numbers, dates, money and times:

* ``wetext whole``: one wetext call on the whole text, as the official frontend does;
* ``normalize``: cosyclone's normalization (wetext sentence by sentence for long texts; memo off);
* ``plan``: normalization + official splitting + tokenization, i.e. what ``validate`` and the
  frontend do per row (tokenizer: ``--qwen-dir``, default the built-in stand-in);
* ``memo hit``: the frontend's pass over a row that manifest validation already normalized
  (printed as microseconds per row).

wetext slows down on long inputs; if ``normalize`` on long texts is not close to its short-text
rate, sentence chunking is not doing its job.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.machine import cpu_name

SHORT_EN = ["In 1999 the population was 1,000,000 and it grew by 50% to 1,500,000.",
            "It costs $5.20, or £3.99 in London.", "The meeting starts at 10:30 and ends at 11:45 pm.",
            "Chapter 7, page 256, line 12.", "The area is 5 m² and the volume is 3 m³.",
            "Dr. Chen said the results were surprising, e.g. the error rate fell by 37%.",
            "Was it worth it? Absolutely! The second phase began on the 3rd of May."]
SHORT_ZH = ["今天是2024年3月15日，气温25℃。", "我的电话是13800138000，请在10:30之前打给我。",
            "第1名获得1000000元奖金。", "这个API的QPS达到了5000，latency只有20ms。",
            "好少咯，一般系放嗰啲国庆啊，中秋嗰啲可能会咯。"]


def long_texts(chars: int) -> list[str]:
    """One English and one Chinese text of about ``chars`` characters built from the short ones."""
    out = []
    for pool, sep in ((SHORT_EN, " "), (SHORT_ZH, "")):
        parts: list[str] = []
        i = 0
        while sum(map(len, parts)) < chars:
            parts.append(pool[i % len(pool)])
            i += 1
        out.append(sep.join(parts))
    return out


def rates(fns: dict[str, Callable[[str], object]], texts: list[str], repeat: int) -> dict[str, float]:
    """Characters per second of each function over ``texts``: best of ``repeat`` rounds.

    The functions take turns within each round, so a busy machine slows all of them alike.
    """
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for t in texts:
                fn(t)
            best[name] = min(best[name], time.perf_counter() - t0)
    chars = sum(map(len, texts))
    return {name: chars / sec for name, sec in best.items()}


def bench(
    qwen_dir: Path | None = None, long_chars: int = 5000, repeat: int = 3
) -> dict[str, dict[str, float]]:
    """{workload: {"short": chars/s, "long": chars/s}}."""
    from cosyclone.frontend.normalize import TextNormalizer, get_normalizer
    from cosyclone.frontend.text import TextFrontend
    from cosyclone.frontend.text_rules import is_only_punctuation, split_paragraph

    if qwen_dir is None:
        from cosyclone.frontend.tiny_assets import write_tiny_tokenizer

        qwen_dir = write_tiny_tokenizer(Path(tempfile.mkdtemp(prefix="bench-text-")) / "qwen")
    fe = TextFrontend(qwen_dir)
    cold = TextNormalizer("wetext", memo_chars=0)  # every call normalizes
    warm = get_normalizer("wetext")
    wetext, utils = cold._wetext, cold._wetext_utils

    def whole(t: str) -> str:
        return wetext.normalize(t, lang=utils.get_lang(t))

    def plan(t: str) -> list[list[int]]:
        """The frontend's per-row text work with the memo off: normalize, split, tokenize."""
        n = cold.normalize(t)
        pieces = split_paragraph(n.text, n.lang, fe.count_tokens)
        return [fe.encode(p) for p in pieces if not is_only_punctuation(p)]

    workloads = {"short": SHORT_EN + SHORT_ZH, "long": long_texts(long_chars)}
    for t in workloads["short"] + workloads["long"]:
        warm.normalize(t)  # what manifest validation leaves behind
    fns = {"wetext whole": whole, "normalize": cold.normalize, "plan": plan, "memo hit": warm.normalize}
    by_size = {k: rates(fns, v * (1 if k == "long" else 20), repeat) for k, v in workloads.items()}
    return {name: {k: by_size[k][name] for k in workloads} for name in fns}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--qwen-dir", type=Path, default=None, help="tokenizer directory (default: built-in stand-in)"
    )
    ap.add_argument("--long-chars", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    figures = bench(a.qwen_dir, a.long_chars, a.repeat)
    print(f"text normalization, one core of {cpu_name()} (chars/s; long = {a.long_chars} chars):")
    for name, f in figures.items():
        if name == "memo hit":
            continue
        print(
            f"  {name:<13} short {f['short']:>10,.0f}   long {f['long']:>10,.0f}   "
            f"long/short {f['long'] / f['short']:.2f}"
        )
    memo = figures["memo hit"]
    print(
        f"  memo hit      {40 / memo['short'] * 1e6:.1f} us per 40-character row "
        f"(the frontend after validation)"
    )
    return figures


if __name__ == "__main__":
    main()
