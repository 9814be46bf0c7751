#!/usr/bin/python3
"""Checks a /metrics page in the Prometheus text format, the way a scraper would take it.

Usage: metrics_check.py URL|FILE [FAMILY...]

The page is parsed by the Prometheus project's own Python parser (prometheus_client, Debian's
python3-prometheus-client: hence /usr/bin/python3, where Debian installs it), which raises on
a malformed line. On top of that, what promtool's `check metrics` and the exposition format
ask of a family, which that parser lets pass:
  * every family has one HELP and one TYPE line, both before its first sample, and its
    samples are contiguous (a family is not continued after another one began);
  * a counter's samples are named NAME_total (a histogram's _bucket/_sum/_count);
  * no series (name and label set) appears twice; names and label names are valid;
  * each FAMILY named on the command line is present with at least one sample.
Prints one line per problem and exits 1 if there is any; else prints a one-line summary.
"""
import re
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("", "_sum", "_count")}


def family_of(sample, types):
    """The declared family a sample name belongs to (None: none)."""
    if sample in types and types[sample] in ("gauge", "untyped", "summary"):
        return sample
    for fam, kind in types.items():
        for suffix in SUFFIXES.get(kind, ("",)):
            if suffix and sample == fam + suffix:
                return fam
    return sample if sample in types else None


def check(text, required):
    problems = []
    try:  # the reference parser: malformed lines, bad escapes, bad values
        parsed = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as e:  # noqa: BLE001 - any parse error is the finding
        return [f"prometheus_client cannot parse it: {e}"], 0, 0
    helps, types, seen_series, finished = {}, {}, set(), set()
    current = None
    n_samples = 0
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    problems.append(f"line {no}: bad metric name {name!r}")
                table = helps if parts[1] == "HELP" else types
                if name in table:
                    problems.append(f"line {no}: second {parts[1]} for {name}")
                if name in finished or (current and current != name and name in types):
                    problems.append(f"line {no}: {parts[1]} for {name} after its samples")
                if parts[1] == "TYPE":
                    kind = parts[3].strip() if len(parts) > 3 else ""
                    if kind not in TYPES:
                        problems.append(f"line {no}: {name} has unknown type {kind!r}")
                    table[name] = kind
                else:
                    table[name] = parts[3] if len(parts) > 3 else ""
            continue
        m = re.match(r"^([^{\s]+)(\{.*\})?\s+(\S+)(\s+\S+)?$", line)
        if not m:
            problems.append(f"line {no}: not a sample: {line!r}")
            continue
        sample, labels = m.group(1), m.group(2) or ""
        n_samples += 1
        fam = family_of(sample, types)
        if fam is None:
            problems.append(f"line {no}: {sample} has no TYPE before it")
            continue
        if fam not in helps:
            problems.append(f"line {no}: family {fam} has no HELP before its samples")
        if types.get(fam) == "counter" and not sample.endswith("_total"):
            problems.append(f"line {no}: counter sample {sample} does not end in _total")
        if current != fam:
            if fam in finished:
                problems.append(f"line {no}: family {fam} continued after another began")
            if current:
                finished.add(current)
            current = fam
        for name in re.findall(r'([^,{=\s]+)="', labels):
            if not LABEL.match(name):
                problems.append(f"line {no}: bad label name {name!r}")
        key = (sample, labels)
        if key in seen_series:
            problems.append(f"line {no}: series {sample}{labels} appears twice")
        seen_series.add(key)
    for fam in types:
        if fam not in helps:
            problems.append(f"family {fam} has a TYPE and no HELP")
    for want in required:
        f = parsed.get(want) or parsed.get(want[:-len("_total")] if want.endswith("_total") else "")
        if f is None or not f.samples:
            problems.append(f"family {want} is missing or has no sample")
    return problems, len(parsed), n_samples


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: metrics_check.py URL|FILE [FAMILY...]")
    src = sys.argv[1]
    try:
        if src.startswith("http://") or src.startswith("https://"):
            text = urllib.request.urlopen(src, timeout=5).read().decode()
        else:
            with open(src, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"metrics_check: {src}: cannot read it: {e}")
    problems, families, samples = check(text, sys.argv[2:])
    for p in problems:
        print(f"metrics_check: {src}: {p}")
    if problems:
        sys.exit(1)
    print(f"metrics_check: {src}: {families} families, {samples} samples, valid")


if __name__ == "__main__":
    main()
