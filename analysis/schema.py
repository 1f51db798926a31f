"""Print the HDF5 layout of a run folder as markdown (the tables of docs/hdf5.md).

    python -m analysis.schema RUN_DIR > schema.md
    python -m analysis.schema RUN_DIR --update docs/hdf5.md   # rewrite its generated part

Streams, fields, dtypes, units and meanings come from the files themselves (the writer stores
``doc`` on every group and ``units``/``doc`` on every dataset); file attributes carry no doc in
the file, so their meanings come from `ATTR_DOCS` here ("(not documented here)" flags a new one).
One file of each kind is described: ``learner.h5``, the first ``learner-<rank>.h5`` (the other
learners of a ``--learners K`` group, when present), the first ``buffer-<site>.h5`` and the first
``actor-<rank>.h5``; ``summary.json`` too when present.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np

__all__ = ["ATTR_DOCS", "SUMMARY_DOCS", "describe_file", "describe_run", "stream_table"]

_COMMON = {
    "config_json": "the run's full config as JSON (every `python -m mpirl.main --help` option: "
    "`env`, `replay_at`, `link`, `seed`, `alpha`, `priority_eps`, ...)",
    "versions_json": "JSON: versions of python, mpirl, torch, numpy, gymnasium, h5py, mpi4py and "
    "the MPI library",
    "layout_json": "JSON list, one entry per world rank: `rank`, `role`, `site`, `host`",
    "t0_unix": "wall-clock time (s since the Unix epoch) of this file's t = 0; add it to a "
    "stream's `t` to align files of different ranks",
    "log_format": "version of the log layout",
    "flush_seconds": "seconds between flushes to disk (a killed rank loses at most this much)",
    "writer_host": "host that wrote the file",
    "writer_pid": "process id of the writer",
    "resumed_unix": "wall-clock times the file was reopened to continue (absent if never)",
    "resumes_json": "JSON list, one entry per `--resume` launch: `checkpoint` id, its `reason`, "
    "`unix` time, `rows_at_checkpoint` and `rows_before_resume` per stream (rows "
    "in between were written by the launch before, after its part of the "
    "checkpoint; docs/reliability.md says which to drop)",
    "resumed_online_sha256": "learner, set at each resume: SHA-256 of the online network as "
    "loaded (equals `online_sha256` in the checkpoint's learner.json)",
    "resumed_target_sha256": "learner, set at each resume: the same for the target network",
    "rank": "world rank of the writer",
    "role": "`learner`, `buffer` or `actor`",
    "site": "edge site of the writer (-1 for the learner)",
    "host": "host name of the writer (from MPI)",
    "world_size": "ranks in the job",
    "link_profile": "the long-haul link as resolved at start (profile and overrides, in words)",
    "seeds_json": "JSON: the random seeds this rank derived from `--seed` in its latest launch "
    "(mpirl/seeds.py): learner `torch`, `replay`, `arrival`, `evaluation` (round "
    "0's episodes), `link` (per site); buffer `replay`, `link`; actor "
    "`exploration`, `envs` (one per env)",
    "reference_set": "learner, with --reference-set: path of the reference set (.npz, "
    "mpirl.refloss) behind /evals/reference_loss",
    "replay_at_auto_json": "only with `--replay-at auto`: the advisor's advice as JSON "
    "(`python -m mpirl.advise --json`'s fields: `replay_at` chosen, `why`, `sentence`, "
    "`inputs`, `predictions` per placement, `confidence`, `evidence`); `config_json`'s "
    "`replay_at` holds the resolved placement",
    "reference_set_sha256": "learner, with --reference-set: sha256 of that set's contents "
    "(mpirl.refloss.content_sha256; `refloss.load(path, sha256=...)` "
    "checks it)",
}

SUMMARY_DOCS = {
    "stop_reason": "why the learner stopped: `target_return`, `max_env_steps`, `max_updates`, "
    "`max_seconds`, `SIGTERM`, `SIGINT`",
    "updates": "learner updates in the run",
    "env_steps": "env steps of all actors (as last reported to the learner)",
    "wall_s": "seconds from the learner's loop start to its stop",
    "wall_s_total": "wall_s summed over every launch of a resumed run (= wall_s if never resumed)",
    "checkpoint": "id of the final checkpoint written at the stop (RUN_DIR/checkpoint)",
    "resumed_from": "checkpoint id this launch resumed from (null: a new run)",
    "best_eval": "best greedy evaluation mean return",
    "busy_fraction": "fraction of wall time the learner spent in updates",
    "delivered_fraction": "replay_at=learner: transitions that reached the learner's memory / "
    "env steps produced (< 1 under --forward-overflow drop-oldest on a link "
    "slower than production); null for replay_at=buffer",
    "link_bytes_in": "bytes the learner received over the link (all buffers), toward the learner",
    "link_bytes_out": "bytes the learner sent over the link (weights, priority updates, credits)",
    "time_to_target_s": "seconds from the learner's loop start to the first eval >= target "
    "(only when reached; over every launch of a resumed run)",
    "env_steps_to_target": "env steps at that eval (only when reached)",
    "updates_to_target": "learner updates at that eval (only when reached)",
    "target_return": "the return target the learner used",
}

ATTR_DOCS: dict[str, dict[str, str]] = {
    "learner": {
        **_COMMON,
        **{k: f"summary, set when the learner stops: {v}" for k, v in SUMMARY_DOCS.items()},
        "device": "the learner's torch device as resolved from --device (`cpu`, `cuda:0`, ...)",
        "device_name": "the GPU's name, or the CPU model for `cpu`",
        "device_memory_gib": "the GPU's memory in GiB (0 for `cpu`)",
        "torch_cuda": "torch.version.cuda of the learner's torch ('' for a CPU build)",
    },
    "learner_worker": {
        **_COMMON,
        "device": "this learner's torch device as resolved from --device",
        "device_name": "the GPU's name, or the CPU model for `cpu`",
        "device_memory_gib": "the GPU's memory in GiB (0 for `cpu`)",
        "torch_cuda": "torch.version.cuda of this learner's torch ('' for a CPU build)",
    },
    "buffer": {
        **_COMMON,
        "env_steps": "set at stop: env steps of this site's actors",
        "inserted": "set at stop: transitions received from the actors",
        "sampled": "set at stop: transitions sent as sampled batches (replay_at=buffer)",
        "stale_dropped": "set at stop: priority updates dropped, slot overwritten",
        "too_stale": "set at stop: priority updates dropped, older than max_staleness",
        "forward_dropped": "set at stop: transitions dropped by --forward-overflow",
        "forwarded": "set at stop: transitions sent toward the learner (replay_at=learner or "
        "thinned)",
        "thinned": "set at stop: transitions the thinning draw left at the edge "
        "(replay_at=thinned; 0 otherwise)",
        "wall_s": "set at stop: seconds the buffer loop ran",
        "link_bytes_out": "set at stop: bytes sent toward the learner",
        "link_raw_bytes_out": "set at stop: the same before compression (= "
        "link_bytes_out when --compress is off)",
        "link_bytes_in": "set at stop: bytes received from the learner",
        "link_msgs_out": "set at stop: messages sent toward the learner",
        "link_msgs_in": "set at stop: messages received from the learner",
    },
    "actor": {
        **_COMMON,
        "epsilons": "exploration rate of each of this actor's envs (Ape-X schedule)",
        "env_steps": "set at stop: env steps of this actor",
        "episodes": "set at stop: episodes finished by this actor",
        "first_step_unix": "wall-clock time (s since the Unix epoch) right after this "
        "actor's first env steps (one per env) of the latest launch: "
        "where start-up ends",
    },
}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _type(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return (
            f"{v.dtype.name}[{', '.join(map(str, v.shape))}]"
            if v.dtype.kind != "O"
            else f"str[{', '.join(map(str, v.shape))}]"
        )
    if isinstance(v, (str, bytes)):
        if isinstance(v, str) and v[:1] in "[{":
            return "str (JSON)"
        return "str"
    return np.asarray(v).dtype.name


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def describe_file(path: str | Path, role: str) -> str:
    """Markdown for one file: its attributes, then every stream with its fields."""
    path = Path(path)
    docs = ATTR_DOCS.get(role, _COMMON)
    out = []
    with h5py.File(path, "r", locking=False) as f:
        out += ["| attribute | type | meaning |", "|---|---|---|"]
        for k in sorted(f.attrs):
            doc = _md_cell(docs.get(k, "(not documented here)"))
            out.append(f"| `{k}` | {_type(f.attrs[k])} | {doc} |")
        for name, g in f.items():
            if not isinstance(g, h5py.Group):
                continue
            fields = [_s(x) for x in g.attrs.get("fields", list(g.keys()))]
            out += stream_table(
                name,
                _s(g.attrs.get("doc", "")),
                [
                    (
                        k,
                        g[k].dtype.str.lstrip("<>|="),
                        g[k].shape[1:],
                        _s(g[k].attrs.get("units", "")),
                        _s(g[k].attrs.get("doc", "")),
                    )
                    for k in fields
                    if k in g
                ],
            )
    return "\n".join(out) + "\n"


def stream_table(name: str, doc: str, rows) -> list[str]:
    """The markdown lines of one stream: ``rows`` of (field, dtype, per-row shape, units, doc)."""
    out = [
        "",
        f"**`/{name}`**: {_md_cell(doc)}",
        "",
        "| field | dtype | shape per row | units | meaning |",
        "|---|---|---|---|---|",
    ]
    for k, dtype, shape, units, doc_k in rows:
        shape = "scalar" if tuple(shape) == () else "×".join(map(str, shape))
        out.append(f"| `{k}` | {dtype} | {shape} | {_md_cell(units) or '-'} | {_md_cell(doc_k)} |")
    return out


def describe_run(run_dir: str | Path) -> str:
    """Markdown for a run folder: one section per file kind, then ``summary.json``."""
    run_dir = Path(run_dir)
    if not (run_dir / "learner.h5").exists():
        raise FileNotFoundError(f"{run_dir} has no learner.h5: not an mpirl run folder")
    files = [("learner.h5", run_dir / "learner.h5", "learner")]
    for pattern, role in (
        ("learner-*.h5", "learner_worker"),
        ("buffer-*.h5", "buffer"),
        ("actor-*.h5", "actor"),
    ):
        found = sorted(run_dir.glob(pattern), key=lambda p: int(p.stem.split("-")[-1]))
        if found:
            label = pattern.replace("*", "<site>" if role == "buffer" else "<rank>")
            files.append((label, found[0], role))
    out = []
    for label, path, role in files:
        out += [f"### `{label}` (example: `{path.name}`)", "", describe_file(path, role)]
    sj = run_dir / "summary.json"
    if sj.exists():
        summary = json.loads(sj.read_text())
        out += [
            "### `summary.json`",
            "",
            (
                "Written by the learner's rank when the run ends (absent while it runs or after "
                "a kill); the same keys are attributes of `learner.h5`."
            ),
            "",
            "| key | type | meaning |",
            "|---|---|---|",
        ]
        for k, v in summary.items():
            out.append(
                f"| `{k}` | {type(v).__name__} | "
                f"{_md_cell(SUMMARY_DOCS.get(k, '(not documented here)'))} |"
            )
        out.append("")
    return "\n".join(out)


BEGIN = "<!-- begin: python -m analysis.schema RUN_DIR -->"
END = "<!-- end: python -m analysis.schema RUN_DIR -->"


def update_doc(doc: str | Path, markdown: str) -> None:
    """Replace the text between the `BEGIN` and `END` markers of ``doc`` with ``markdown``."""
    doc = Path(doc)
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{BEGIN}\n\n{markdown}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.schema",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("run_dir", help="a run folder (holds learner.h5)")
    ap.add_argument(
        "--update",
        metavar="DOC",
        help="write into DOC between its markers (docs/hdf5.md) instead of printing",
    )
    a = ap.parse_args(argv)
    try:
        md = describe_run(a.run_dir)
        if a.update:
            update_doc(a.update, md)
        else:
            sys.stdout.write(md)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis.schema: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
