"""Training text: the King James Bible (public domain), from Debian's
`bible-kjv` package, split into a training and a held-out validation text.

The split is by blocks of 30 consecutive verses: every 20th block (blocks
19, 39, ...) is held out, about 5% of the text spread evenly through it. Each
verse becomes one line of text with its reference ("Ge1:1 ") stripped.

    /usr/bin/python3 -m loopserve_torch.data OUT_DIR

writes OUT_DIR/train.txt and OUT_DIR/val.txt; `loopserve tokenize` turns each
into a flat file of uint16 GPT-2 token ids (train.bin, val.bin) that
`loopserve_torch.train` reads.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess

import numpy as np

BLOCK_VERSES = 30
HOLDOUT_EVERY = 20
ALL_VERSES = "Gen1:1-Rev22:21"
_REFERENCE = re.compile(r"^[1-3]?[A-Za-z]+\d+:\d+\s+")


def kjv_verses() -> list[str]:
    """Every verse of the KJV in canonical order, references stripped."""
    try:
        out = subprocess.run(["bible", "-f", ALL_VERSES], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SystemExit("the `bible` command is missing: apt-get install bible-kjv") from None
    verses = []
    for line in out.splitlines():
        m = _REFERENCE.match(line)
        if m is None:
            raise SystemExit(f"unexpected line from bible(1): {line[:80]!r}")
        verses.append(line[m.end() :].strip())
    return verses


def split(verses: list[str]) -> tuple[list[str], list[str]]:
    """(training verses, held-out verses): every HOLDOUT_EVERY-th block of BLOCK_VERSES."""
    train, val = [], []
    for i in range(0, len(verses), BLOCK_VERSES):
        block = verses[i : i + BLOCK_VERSES]
        (val if (i // BLOCK_VERSES) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).extend(block)
    return train, val


def read_tokens(path: str) -> np.ndarray:
    """A token file written by `loopserve tokenize`: little-endian uint16 ids."""
    return np.fromfile(path, dtype="<u2").astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    train, val = split(kjv_verses())
    for name, verses in (("train", train), ("val", val)):
        path = os.path.join(args.out_dir, f"{name}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(verses) + "\n")
        print(f"{path}: {len(verses)} verses, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
