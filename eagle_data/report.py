"""The static HTML quality report: self-contained pages, charts drawn as inline SVG.

No plotting dependency and no external assets, so a page opens from a local folder or an S3 console
download alike. `write_shard_report` and `write_dataset_report` store one page per shard and one per
dataset next to the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from html import escape

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.quality import CHECK_COLUMNS, Inputs, ShardRecord, on_policy, rollup, row_verdicts, shard_record
from eagle_data.quality.figures import Bins, Figures, markdown_table, on_policy_bins
from eagle_data.quality.gates import CheckResult
from eagle_data.quality.records import JUDGED, Judged, judged_rollup
from eagle_data.quality.sampled import COLUMN as SAMPLED_COLUMN
from eagle_data.quality.sampled import rank_bins
from eagle_data.storage import ShardStore, digest, read_columns
from eagle_data.storage.digests import FileDigest, check, materialize_command

Log = Callable[[str], None]

_W, _H, _PAD = 640, 260, 50  # chart size and margin, px
_COLORS = ("#2563eb", "#dc2626", "#d97706", "#059669")
_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #111; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #059669; font-weight: 600; } .fail { color: #dc2626; font-weight: 600; }
.warn { color: #d97706; font-weight: 600; }
svg { display: block; margin: 0.5em 0 1.5em; } svg text { font: 10px system-ui, sans-serif; }
"""


def bar_chart(bins: Bins, title: str) -> str:
    """Vertical bars, one per bin, count above each bar and the bin label below it."""
    top = max((n for _, n in bins), default=0) or 1
    step = (_W - 2 * _PAD) / max(len(bins), 1)
    bars = []
    for i, (label, n) in enumerate(bins):
        h = (_H - 2 * _PAD) * n / top
        x, y = _PAD + i * step, _H - _PAD - h
        bars.append(
            f'<rect x="{x + 2:.1f}" y="{y:.1f}" width="{step - 4:.1f}" height="{h:.1f}" fill="{_COLORS[0]}">'
            f"<title>{escape(label)}: {n}</title></rect>"
            f'<text x="{x + step / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{n}</text>'
            f'<text transform="translate({x + step / 2:.1f},{_H - _PAD + 10}) rotate(-35)" text-anchor="end">'
            f"{escape(label)}</text>"
        )
    return _svg(title, "".join(bars))


def line_chart(xs: Sequence[str], series: dict[str, Sequence[float]], title: str) -> str:
    """One polyline per series over shared x labels (shards), y from 0 to the largest value."""
    top = max((v for values in series.values() for v in values), default=0) or 1
    step = (_W - 2 * _PAD) / max(len(xs) - 1, 1)

    def point(i: int, v: float) -> tuple[float, float]:
        return _PAD + i * step, _H - _PAD - (_H - 2 * _PAD) * v / top

    parts = [f'<text x="4" y="{_PAD}">{top:g}</text><text x="4" y="{_H - _PAD}">0</text>']
    for k, (name, values) in enumerate(series.items()):
        color = _COLORS[k % len(_COLORS)]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (point(i, v) for i, v in enumerate(values)))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts += [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"><title>{escape(name)} shard '
            f"{escape(xs[i])}: {values[i]:g}</title></circle>"
            for i, (x, y) in enumerate(point(i, v) for i, v in enumerate(values))
        ]
        parts.append(f'<text x="{_PAD + 140 * k}" y="{_PAD - 8}" fill="{color}">{escape(name)}</text>')
    if xs:
        parts.append(f'<text x="{_PAD}" y="{_H - _PAD + 12}">{escape(xs[0])}</text>')
        parts.append(f'<text x="{_W - _PAD}" y="{_H - _PAD + 12}" text-anchor="end">{escape(xs[-1])}</text>')
    return _svg(title, "".join(parts))


def _svg(title: str, body: str) -> str:
    axis = f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#888"/>'
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>{axis}{body}</svg>'
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        num = isinstance(v, int | float)
        text = f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else escape(str(v))
        return f'<td class="num">{text}</td>' if num else f"<td>{text}</td>"

    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _check_rows(results: Sequence[CheckResult]) -> list[str]:
    rows = []
    for r in results:
        css, label = ("pass", "PASS") if r.passed else ("fail", "FAIL") if r.severity == "ERROR" else ("warn", "WARN")
        blocking = " (blocking)" if r.blocking else ""
        rows.append(
            f'<tr><td>{escape(r.name)}</td><td class="{css}">{label}</td><td>{r.severity}{blocking}</td>'
            f"<td>{escape(r.message)}</td></tr>"
        )
    return rows


# The check that is not a quality gate: judged after validation by `{ds}_decontamination`, so a page written
# before it ran names it and where its result will be, instead of leaving it out; once judged, the shard's page
# shows the outcome stored in its record.
DECONTAMINATION_ROW = (
    "<tr><td>decontamination</td><td>not judged yet</td><td>ERROR (blocking)</td><td>judged after validation by "
    "the {check} check: each shard's result is on its own page and {asset}'s Checks tab</td></tr>"
)
ON_POLICY_ROW = (  # judged from the shard's stored scores by its own check (eagle_data/defs/on_policy.py)
    "<tr><td>on_policy</td><td>see Dagster</td><td>ERROR (blocking)</td><td>judged from the scored rows by the "
    "{check} check: each shard's result is on {asset}'s Checks tab; the figures are below</td></tr>"
)


def _judged_rows(judged: Sequence[Judged]) -> list[str]:
    return [
        f'<tr><td>{escape(j.check)}</td><td class="{"pass" if j.passed else "fail"}">{"PASS" if j.passed else "FAIL"}'
        f"</td><td>ERROR (blocking)</td><td>{escape(j.message)}</td></tr>"
        for j in judged
    ]


def _shard_links(figures: Figures) -> str:
    """The dataset page's links to each shard's own page (a file next to it: relative links open anywhere)."""
    items = "".join(f'<li><a href="{escape(str(r["shard"]))}.html">shard {escape(str(r["shard"]))}</a></li>'
                    for r in figures.shards)  # fmt: skip
    return f"<h2>Shard pages</h2><ul>{items}</ul>" if items else ""


def render_report(
    title: str, figures: Figures, results: Sequence[CheckResult], dataset: str = "", judged: Sequence[Judged] = ()
) -> bytes:
    """The report page as UTF-8 bytes: checks, key figures, histograms, per-shard trends, verdicts; with
    `dataset`, the decontamination check's row (its stored outcome when `judged` holds one) and, on a roll-up,
    links to each shard's page."""
    pending = bool(dataset) and not judged  # decontamination is the one check judged after validation
    sections = [
        f"<h1>{escape(title)}</h1>",
        "<h2>Checks</h2><table><tr><th>check</th><th>result</th><th>severity</th><th>figures</th></tr>",
        *_check_rows(results),
        *_judged_rows(judged),
        DECONTAMINATION_ROW.format(check=escape(f"{dataset}_decontamination"), asset=escape(f"{dataset}_validated"))
        if pending
        else "",
        ON_POLICY_ROW.format(check=escape(f"{dataset}_on_policy"), asset=escape(f"{dataset}_validated"))
        if dataset
        else "",
        "</table>",
        _shard_links(figures),
        "<h2>Figures</h2>",
        _table(["figure", "value"], sorted(figures.numbers.items())),
        "<h2>Completion tokens</h2>",
        bar_chart(figures.completion_hist, "Replies by completion tokens"),
        "<h2>Loss-mask sums</h2>",
        bar_chart(figures.loss_hist, "Replies by loss-mask sum"),
        "<h2>Token accounting</h2>",
        bar_chart(figures.ratio_hist, "Replies by rebuilt tokens, % of the tokens the engine reported"),
    ]
    if agreement := on_policy_bins(figures.numbers):  # the target's own score (quality/on_policy.py)
        sections += ["<h2>On-policy score</h2>", bar_chart(agreement, "Scored rows by top-1 agreement with the target")]
    if ranks := rank_bins(figures.numbers):  # what the engine reported of its own tokens (quality/sampled.py)
        title = "Sampled tokens by their rank among the engine's most likely (0: its top choice)"
        sections += ["<h2>Sampled tokens, as the engine reported them</h2>", bar_chart(ranks, title)]
    if figures.shards:
        xs = [str(r["shard"]) for r in figures.shards]
        shares = {k: [float(r[k]) for r in figures.shards] for k in ("truncated_share", "failed_share", "short_share")}
        sections += [
            "<h2>Per shard</h2>",
            line_chart(xs, shares, "Shares per shard"),
            line_chart(
                xs,
                {"avg_completion_tokens": [float(r["avg_completion_tokens"]) for r in figures.shards]},
                "Average completion tokens per shard",
            ),
            _table(list(figures.shards[0]), [list(r.values()) for r in figures.shards]),
        ]
    sections += ["<h2>Verdicts</h2>", _table(["verdict", "rows"], _verdict_rows(figures))]
    page = "\n".join(sections)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_CSS}</style></head><body>\n{page}\n</body></html>\n"
    ).encode()


def _verdict_rows(figures: Figures) -> list[tuple[str, int]]:
    return sorted(figures.verdicts.items(), key=lambda kv: -kv[1])


def inputs_for(spec: DatasetSpec, previous_avg_completion_tokens: float | None = None) -> Inputs:
    return Inputs(spec.checks, spec.generation.thinking, previous_avg_completion_tokens)


def write_shard_report(spec: DatasetSpec, store: ShardStore, record: ShardRecord) -> str:
    """Store a shard's quality record and its report page; returns the page's URI."""
    store.write_bytes(layout.quality_record(spec.name, record.partition), record.to_json())
    title = f"{spec.title or spec.name}: shard {record.partition}"
    page = render_report(title, record.figures(), record.results, spec.name, record.current_judged())
    return store.write_bytes(layout.quality_page(spec.name, record.partition), page)


def stored_record(spec: DatasetSpec, store: ShardStore, key: str) -> ShardRecord | None:
    """A shard's stored record as it is (None: none, or of another schema); `read_record` rebuilds a stale one."""
    return _stored(store, spec.name, key)


def _stored(store: ShardStore, dataset: str, key: str) -> ShardRecord | None:
    """The record with the outcomes of the checks judged after validation joined in (each its own object)."""
    path = layout.quality_record(dataset, key)
    record = ShardRecord.from_json(store.read_bytes(path)) if store.exists(path) else None
    return replace(record, judged_after=judged_outcomes(store, dataset, key)) if record else None


def judged_outcomes(store: ShardStore, dataset: str, key: str) -> tuple[Judged, ...]:
    """The stored outcomes of the checks judged after validation on a shard, by check name (whichever bytes
    each judged: the admission and the page compare digests)."""
    keys = [k for k in store.list(layout.judged_prefix(dataset, key)) if (p := layout.parse(k)) and p.kind == "judged"]
    return tuple(sorted((JUDGED.validate_json(store.read_bytes(k)) for k in keys), key=lambda j: j.check))


def validated_bytes(store: ShardStore, dataset: str, key: str) -> bytes:
    """A validated shard's bytes, once they are those its quality record says validation stored (a
    `digests.ChangedFile` line otherwise; a shard without a digest in its record is read as it is)."""
    asset = layout.validated_asset(dataset)
    data = store.shard_bytes(dataset, asset, key)
    record = _stored(store, dataset, key)
    recorded = FileDigest(record.shard_sha256, record.shard_size) if record and record.shard_sha256 else None
    check(store.uri(layout.shard(dataset, asset, key)), FileDigest.of(data), recorded, materialize_command(asset, key))
    return data


def record_judged(spec: DatasetSpec, store: ShardStore, key: str, judged: Judged, log: Log = print) -> None:
    """Store a check judged after validation (decontamination, on_policy) as its own object, where the export's
    admission reads it with the shard's record, and show it on the shard's page. Its own object: these checks
    run side by side, and each rewriting the shared record lost the other's outcome. A record judged with other
    thresholds is rebuilt first, exactly as the gates' check step (which may run beside this one) rebuilds it.
    A shard without a record of this schema gets no page (the gates' check step rebuilds the record)."""
    store.write_bytes(layout.judged_outcome(spec.name, key, judged.check), JUDGED.dump_json(judged))
    if stored_record(spec, store, key) is None:
        log(f"{spec.name} shard {key}: no quality record to show its {judged.check} outcome; re-run its checks")
        return
    write_shard_report(spec, store, read_record(spec, store, key, log, judged.run_id))


def read_record(spec: DatasetSpec, store: ShardStore, key: str, log: Log = print, run_id: str = "") -> ShardRecord:
    """A shard's stored record. One that is stale (older schema, judged with other thresholds than the
    catalog's now, or without the digest of the bytes it judged) is rebuilt from the validated shard (by run
    `run_id`; the outcomes judged after validation on those same bytes carried over), stored, and announced in
    one line."""
    record = stored_record(spec, store, key)
    if record is None:
        why = "missing or of an older schema"
    elif (record.inputs.checks, record.inputs.thinking) != (spec.checks, spec.generation.thinking):
        why = "judged with other thresholds"
    elif not record.shard_sha256:
        why = "without the digest of the shard it judged"
    else:
        return record
    previous = record.inputs.previous_avg_completion_tokens if record else None
    data = store.shard_bytes(spec.name, layout.validated_asset(spec.name), key)
    columns = (*CHECK_COLUMNS, on_policy.COLUMN, SAMPLED_COLUMN)  # no token lists
    frame = row_verdicts(read_columns(data, columns), spec.checks, spec.generation.thinking)
    log(f"{spec.name} shard {key}: quality record {why}; rebuilt from the validated shard")
    run = run_id or (record.run_id if record else "")
    fresh = shard_record(key, frame, inputs_for(spec, previous))
    rebuilt = replace(fresh, shard_sha256=digest(data), shard_size=len(data), run_id=run,
                      judged_after=judged_outcomes(store, spec.name, key))  # fmt: skip
    write_shard_report(spec, store, rebuilt)
    return rebuilt


def rounded(value: object) -> object:
    """A figure as a person reads it: floats to 4 decimal places (0.9722, not 0.9722222222222222)."""
    return round(value, 4) if isinstance(value, float) else value


SHARD_TABLE_ROWS = 20  # shards in the asset page's per-shard table

HEADLINE_FIGURES = (  # of the dataset page
    "rows", "train_rows", "pass_share", "avg_completion_tokens", "on_policy_agreement", "on_policy_expected_agreement",
)  # fmt: skip


@dataclass(frozen=True)
class DatasetReport:
    """The dataset page written, and what it shows at the top: its figures travel as asset metadata, so
    reading them needs no file (a browser refuses `file://` links from a web page)."""

    uri: str
    shards: int
    figures: Figures
    results: tuple[CheckResult, ...]

    def numbers(self) -> dict[str, float | int]:
        """`dataset_<figure>` over every judged shard (a partition's own figures keep the bare names), shares
        rounded to 4 places as the page shows them."""
        found = {name: self.figures.numbers[name] for name in HEADLINE_FIGURES if name in self.figures.numbers}
        return {"dataset_shards": self.shards, **{f"dataset_{name}": rounded(value) for name, value in found.items()}}

    def shards_table(self, limit: int = SHARD_TABLE_ROWS) -> str:
        """The page's per-shard table in markdown: the `limit` shards keeping the smallest share of their rows
        (all of them on a small dataset), in shard order. Bounded, since it repeats on every partition's event."""
        shards = self.figures.shards
        if not shards:
            return ""
        worst = sorted(shards, key=lambda r: (int(r["train_rows"]) / max(int(r["rows"]), 1), str(r["shard"])))[:limit]
        names = list(shards[0])
        rows = [[rounded(row[n]) for n in names] for row in sorted(worst, key=lambda r: str(r["shard"]))]
        more = f"\n\n{len(shards) - limit} more shards on the report page" if len(shards) > limit else ""
        return markdown_table(names, rows) + more

    def checks_table(self) -> str:
        """Every check over the judged shards, as the page's first table, in markdown."""
        rows = [[r.name, "pass" if r.passed else f"FAIL ({r.severity})", r.message.replace("|", "/")]
                for r in self.results]  # fmt: skip
        return markdown_table(["check", "result", "figures"], rows)


def write_dataset_report(spec: DatasetSpec, store: ShardStore, log: Log = print) -> DatasetReport:
    """Refresh the dataset page (`{root}/{ds}/{ds}_quality/index.html`) from every shard's record.

    Two runs finishing at once may leave the page one shard behind; the next materialization brings it
    up to date.
    """
    parsed = (layout.parse(k) for k in store.list(layout.quality_prefix(spec.name)))
    records = [read_record(spec, store, p.partition, log) for p in parsed if p and p.kind == "quality_record"]
    fig, results = rollup(records)
    title = f"{spec.title or spec.name} ({spec.name}): {len(records)} of {spec.num_shards} shards"
    page = render_report(title, fig, results, spec.name, judged_rollup(records))
    uri = store.write_bytes(layout.quality_index(spec.name), page)
    return DatasetReport(uri, len(records), fig, tuple(results))
