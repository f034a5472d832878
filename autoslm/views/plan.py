"""`autoslm plan` as a person reads it: one line per offer under short headers, cheapest estimate first.

The rows are ``PlannedOffer`` dicts (``--json`` prints them whole). Here they become about nine
columns (the step time with the decode waves a GRPO step takes beside it) that fit 80 characters without cutting a cell: a narrow terminal loses optional columns,
never the end of a cell. What every row shares (catalog prices, how the time was estimated, the
setup time) is said once under the table; an unusable offer is listed after the usable ones with
its reason in a word, and the reasons spelled out below. Plain string building, like the runs table.
"""

from __future__ import annotations

import re

CHOSEN = ">"
# An estimate's basis ("300 steps x ~25.1 s + 8 evaluations x ~104 s + 9 min setup (MFU 30%)"): the step
# and evaluation times are the GPU's own, the rest is the same for every row.
_BASIS = re.compile(
    r"^(?P<steps>\d+) steps x ~(?P<step>[\d.]+) s (?:\+ (?P<evals>\d+ evaluations?) x ~[\d.]+ s )?"
    r"(?P<harness>\+ lm-eval ~[\d.]+ min )?\+ (?P<rest>.*)$"
)


def _money(v) -> str:
    return "-" if v is None else f"${v:.2f}"


def _hours(h) -> str:
    if h is None:
        return "-"
    if h < 1:
        return f"{max(1, round(h * 60))} min"
    return f"{h:.1f} h" if h < 10 else f"{h:.0f} h"


def _gb(v) -> str:
    return "?" if v is None else f"{v:g}" if float(v).is_integer() else f"{v:.1f}"


def _gpu(r: dict) -> str:
    n, pods = r.get("gpu_count") or 1, r.get("nodes") or 1
    return (f"{pods} pods x " if pods > 1 else "") + (f"{n}x " if n > 1 else "") + str(r.get("gpu") or "?")


def _price(r: dict) -> str:
    """The replica's price an hour: every pod of it (``nodes``) at the offer's price."""
    price = r.get("price_per_hour")
    return "-" if price is None else f"{price * (r.get('nodes') or 1):.3f}"


def _step(r: dict) -> str:
    """Seconds per optimizer step, and for GRPO the decode waves a step takes (generation counted once per wave)."""
    step = r.get("step_s")
    if step is None:
        return "-"
    cell = f"{step:.0f} s" if step >= 10 else f"{step:.1f} s"
    return cell + (f" ({r['waves']})" if r.get("waves") else "")


def _fits(r: dict) -> str:
    if "vram_gb" not in r:
        return "-"
    return f"{_gb(r.get('vram_need_gb'))}/{_gb(r.get('vram_gb'))}"


def reason_word(r: dict) -> str:
    """Why an offer is not usable, in a word (the note under the table says it whole)."""
    note = r.get("note") or ""
    if r.get("fits") is False:
        return "no-fit"
    if "interruptible" in note:
        return "no-spot"
    hours, money = "limits.max_hours" in note, "limits.max_usd" in note
    if hours or money:
        return "limits" if hours and money else "time" if hours else "budget"
    return "unusable"


# (header, cell, right-aligned, the narrowest terminal that shows it)
COLUMNS = (
    ("provider", lambda r: str(r.get("provider") or "?"), False, 0),
    ("GPU", _gpu, False, 0),
    ("$/hour", _price, True, 0),
    ("GB need/has", _fits, True, 0),
    ("step (waves)", _step, True, 0),
    ("est. time", lambda r: _hours(r.get("est_hours")), True, 0),
    ("est. cost", lambda r: _money(r.get("estimated_cost_usd")), True, 0),
    ("max cost", lambda r: _money(r.get("max_cost_usd")), True, 0),
    ("location", lambda r: str(r.get("location") or "-"), False, 110),
    ("reliability", lambda r: f"{r['reliability']:.1%}" if r.get("reliability") is not None else "-", True, 120),
)


def sort_key(r: dict):
    est = r.get("estimated_cost_usd")
    return (not r.get("usable", True), est is None, est or 0.0, r.get("price_per_hour") or 0.0)


def chosen(rows: list[dict]) -> dict | None:
    """The offer a launch takes: the first usable one in failover order (the order ``plan_offers`` gives)."""
    return next((r for r in rows if r.get("usable", True)), None)


def _parts(note: str) -> list[str]:
    """A note's "; "-separated parts, not splitting inside parentheses."""
    out, depth, cur = [], 0, ""
    for i, ch in enumerate(note):
        depth += ch == "("
        depth -= ch == ")"
        if ch == ";" and depth == 0 and note[i + 1 : i + 2] == " ":
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return out + [cur]


def shared_notes(rows: list[dict]) -> tuple[list[str], dict[int, list[str]]]:
    """(notes every row shares, id(row) -> the notes only it has). A provider's notes shared by all its
    rows are said once for the provider ("runpod: catalog price ...")."""
    parts: dict[int, list[str]] = {}
    for r in rows:
        own = []
        for p in _parts(r.get("note") or ""):
            p = p.strip()
            m = _BASIS.match(p)
            if m:  # the per-GPU step and evaluation times are in the est. time column; the rest is common
                evals = f" + {m['evals']} of the held-out split at each GPU's estimated time for one" if m["evals"] else ""
                harness = " + lm-eval of the base and the adapter at each GPU's estimated time" if m["harness"] else ""
                p = f"est. time: {m['steps']} steps at each GPU's estimated step time{evals}{harness} + {m['rest']}"
            if p:
                own.append(p)
        parts[id(r)] = own

    def shared_by(group: list[dict]) -> list[str]:
        return [p for p in dict.fromkeys(parts[id(group[0])]) if all(p in parts[id(r)] for r in group)] if group else []

    common = shared_by(rows)
    out = list(common)
    providers = list(dict.fromkeys(r.get("provider") for r in rows))
    if len(providers) > 1:
        for name in providers:
            mine = [r for r in rows if r.get("provider") == name]
            for p in shared_by(mine):
                if p not in common:
                    out.append(f"{name}: {p}")
                    for r in mine:
                        parts[id(r)] = [q for q in parts[id(r)] if q != p]
    rest = {k: [p for p in v if p not in common] for k, v in parts.items()}
    return out, rest


def plan_table(rows: list[dict], width: int = 80, title: str = "", problems: dict[str, str] | None = None) -> str:
    """The offers as aligned text no wider than ``width`` (at least 60), every cell whole, then the notes."""
    width = max(60, width)
    ordered = sorted(rows, key=sort_key)
    pick = chosen(rows)
    unusable = [r for r in ordered if not r.get("usable", True)]
    out = [title] if title else []
    out += _table_lines(ordered, pick, unusable, width)
    out += [wrap(x, width) for x in _note_lines(rows, ordered, pick, unusable, problems)]
    return "\n".join(out)


def _columns(rows: list[dict], width: int) -> list:
    """The columns that fit ``width``, less those with nothing to say for these rows."""
    cols = [c for c in COLUMNS if width >= c[3]]
    if not any("vram_gb" in r for r in rows):  # local: no memory or time estimate to show
        return [
            c for c in cols if c[0] not in ("GB need/has", "step (waves)", "est. time", "max cost", "location", "reliability")
        ]
    if not any(r.get("step_s") is not None for r in rows):
        return [c for c in cols if c[0] != "step (waves)"]
    return cols


def _table_lines(ordered: list[dict], pick, unusable: list[dict], width: int) -> list[str]:
    """The header, its rule and one line per offer (the unusable ones under their own heading)."""
    cols = _columns(ordered, width)
    headers = [""] + [c[0] for c in cols] + (["why not"] if unusable else [])
    body = [
        [CHOSEN if r is pick else ""]
        + [c[1](r) for c in cols]
        + ([reason_word(r) if not r.get("usable", True) else ""] if unusable else [])
        for r in ordered
    ]
    right = [False] + [c[2] for c in cols] + ([False] if unusable else [])
    gap = 2

    def layout(cols_headers, cells):
        widths = [max(len(h), *(len(b[i]) for b in cells)) if cells else len(h) for i, h in enumerate(cols_headers)]
        return widths, sum(widths) + gap * (len(widths) - 1)

    widths, total = layout(headers, body)
    if total > width:  # one space between columns before any column goes
        gap = 1
        widths, total = layout(headers, body)
    # Too wide: drop whole columns, the least needed first (the costs stay: they are what plan is for).
    for name in ("reliability", "location", "step (waves)", "est. time", "GB need/has", "$/hour"):
        if total <= width or name not in headers:
            continue
        i = headers.index(name)
        for cells in (headers, right, *body):
            cells.pop(i)
        widths, total = layout(headers, body)

    def line(cells):
        return (" " * gap).join((c.rjust(w) if ra else c.ljust(w)) for c, w, ra in zip(cells, widths, right)).rstrip()

    out = [line(headers), (" " * gap).join("-" * w for w in widths)]
    usable_n = len(ordered) - len(unusable)
    for i, b in enumerate(body):
        if unusable and i == usable_n:
            out.append("not usable:" if usable_n else "no usable offer:")
        out.append(line(b))
    return out


def _note_lines(rows: list[dict], ordered: list[dict], pick, unusable: list[dict], problems: dict[str, str] | None) -> list[str]:
    """What the table cannot say in its cells: the chosen mark, shared notes, why each unusable kind is,
    what runs slower than it could (said per GPU once), and each provider that could not be asked."""
    notes, own = shared_notes(rows)
    lines = []
    if pick is not None and len(rows) > 1:
        lines.append(f"{CHOSEN} the offer a launch takes (the first usable one, providers in compute.provider order)")
    lines += [f"note: {n}" for n in notes]
    reasons = {}
    for r in unusable:
        reasons.setdefault(reason_word(r), "; ".join(own.get(id(r), [])) or (r.get("note") or ""))
    lines += [f"{word}: {why}" for word, why in reasons.items()]
    warned = set()
    for r in (r for r in ordered if r.get("usable", True)):  # fits, but slower than it could (decode waves)
        for p in own.get(id(r), []):
            if "decode" in p and (r.get("gpu"), p) not in warned:
                warned.add((r.get("gpu"), p))
                lines.append(f"warning: {_gpu(r)}: {p}")
    lines += [f"{name}: no offers shown: {err}" for name, err in (problems or {}).items()]
    return lines


def wrap(text: str, width: int, indent: str = "  ") -> str:
    """Word-wrap a note (never a word cut: an over-long word gets a line of its own)."""
    import textwrap

    return (
        "\n".join(textwrap.wrap(text, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False))
        or text
    )
