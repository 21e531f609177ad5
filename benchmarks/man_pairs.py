"""Prompt/response pairs trainwise never saw, from this machine's man pages: a page's DESCRIPTION (the prompt) and its
NAME line's summary (the response), as a CSV with columns `description` and `summary`. The H200 study of issue 53
used such a file; benchmarks/device_session.sh carries one made here (the device machine has no man pages).

    .venv/bin/python benchmarks/man_pairs.py OUT.csv [--limit 2000] [--sections 1,8]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import re
from pathlib import Path

FONT = re.compile(r"\\f[BIRP]|\\f\(..|\\&|\\\(..|\\e")


def _text(lines: list[str]) -> str:
    words = []
    for line in lines:
        if line.startswith(".") and not line.startswith((".B ", ".I ", ".BR ", ".IR ", ".BI ", ".RB ", ".RI ")):
            continue
        line = re.sub(r"^\.\w+\s*", "", line)
        words.append(FONT.sub("", line.replace("\\-", "-")).replace('"', "").strip())
    return " ".join(w for w in words if w)


def page(path: Path) -> tuple[str, str] | None:
    """(description, summary) of one troff man page, or None when it has no such sections."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                raw = f.read()
        else:
            raw = path.read_text(encoding="utf-8", errors="replace")
    except (OSError, EOFError):
        return None
    sections: dict[str, list[str]] = {}
    current = None
    for line in raw.splitlines():
        found = re.match(r'^\.S[Hh]\s+"?([^"]+)"?', line)
        if found:
            current = found.group(1).strip().upper()
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
    name, description = _text(sections.get("NAME", [])), _text(sections.get("DESCRIPTION", []))
    summary = name.split(" - ", 1)[-1].strip() if " - " in name else ""
    if not summary or len(description.split()) < 8:
        return None
    return " ".join(description.split()[:300]), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--sections", default="1,8")
    args = ap.parse_args()
    rows = []
    for section in args.sections.split(","):
        for path in sorted(Path(f"/usr/share/man/man{section}").glob("*")):
            if (found := page(path)) is not None:
                rows.append(found)
            if len(rows) >= args.limit:
                break
    with args.out.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["description", "summary"])
        w.writerows(rows)
    print(f"{len(rows)} pairs -> {args.out}")


if __name__ == "__main__":
    main()
