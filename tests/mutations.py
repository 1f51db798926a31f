"""Break the code on purpose and see the suite notice: each mutation is applied to a scratch
copy of the working tree, the tests that guard it run there, and the table says caught (they
failed) or MISSED (they passed).

    python tests/mutations.py              # every mutation
    python tests/mutations.py jitter clip  # those whose name contains a word given

Not part of the default run (no ``test_`` prefix). The copy's mpirl is the one imported, by
pytest and by every rank it starts (PYTHONPATH; checked before anything runs). The unmutated
copy runs the same tests first: a mutation only counts as caught against tests that pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Mutation(NamedTuple):
    name: str
    path: str  # relative to the repository
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments


MUTATIONS = [
    Mutation(
        "buffer: priority updates not applied",
        "mpirl/roles/placements/at_buffer.py",
        "dropped = memory.update(m.indices, m.generations, m.td_abs)",
        "dropped = 0",
        ("tests/test_mpi.py", "-k", "pipeline and 3-1-buffer"),
    ),
    Mutation(
        "link: jitter removed",
        "mpirl/transport/link.py",
        "lat += self._rng.uniform(-self.profile.jitter_s, self.profile.jitter_s)",
        "lat += 0.0",
        ("tests/test_link.py::test_latency_and_fifo_with_jitter",),
    ),
    Mutation(
        "train step: gradient clip off",
        "mpirl/agent/train_step.py",
        "        if self.grad_clip > 0:\n            self._clip(scale)",
        "        if False:\n            self._clip(scale)",
        ("tests/test_learning_parts.py", "-k", "clip"),
    ),
    Mutation(
        "allreduce: a short batch's gradient not weighted",
        "mpirl/transport/group.py",
        "        if w != 1.0:\n            grad *= w",
        "        if False:\n            grad *= w",
        ("tests/test_learner_group.py", "-k", "weighs or concatenated"),
    ),
    Mutation(
        "node sum: one slot per rank, not two by parity (a rank an update ahead overwrites it)",
        "mpirl/transport/node_sum.py",
        "        self._all = tuple(tuple(self.slots[s, r] for r in range(self.k)) for s in (0, 1))",
        "        self._all = tuple(tuple(self.slots[s, r] for r in range(self.k)) for s in (0, 0))",
        ("tests/test_learner_group.py", "-k", "node_sum"),
    ),
    Mutation(
        "node sum: a flag one update behind taken as in",
        "mpirl/transport/node_sum.py",
        "            if flags[i] < seq:",
        "            if flags[i] < seq - 1:",
        ("tests/test_learner_group.py", "-k", "node_sum"),
    ),
    Mutation(
        "allreduce: Adam's zero_grad says intact though it dropped a gradient",
        "mpirl/agent/dqn.py",
        "            self._checked = (buf, views)\n"
        "            self.intact = all(v is not None for v in views)",
        "            self._checked = (buf, views)\n            self.intact = True",
        ("tests/test_learner_group.py", "-k", "weighs"),
    ),
    Mutation(
        "allreduce: the gradients' binding trusted once",
        "mpirl/transport/group.py",
        "        if not (same and all(p.grad is v for p, v in zip(params, views, strict=True))):",
        "        if not views:",
        ("tests/test_learner_group.py", "-k", "weighs"),
    ),
    Mutation(
        "train step: target copied every update",
        "mpirl/agent/train_step.py",
        "if self.updates % self.target_update == 0:",
        "if True:",
        ("tests/test_learning_parts.py::test_target_network_copied_exactly_every_target_update",),
    ),
    Mutation(
        "train step: target cadence off by one",
        "mpirl/agent/train_step.py",
        "if self.updates % self.target_update == 0:",
        "if (self.updates + 1) % self.target_update == 0:",
        ("tests/test_learning_parts.py::test_target_network_copied_exactly_every_target_update",),
    ),
    Mutation(
        "actor: Ape-X epsilons per actor, not over all envs",
        "mpirl/roles/actor.py",
        "epsilon(self.me.index * n_envs + j, n_total, cfg.eps_base, cfg.eps_alpha)",
        "epsilon(j, n_envs, cfg.eps_base, cfg.eps_alpha)",
        ("tests/test_mpi.py", "-k", "pipeline and 5-1-buffer"),
    ),
    Mutation(
        "actor: Ape-X epsilons i/N instead of i/(N-1)",
        "mpirl/roles/actor.py",
        "base ** (1 + alpha * i / (n - 1))",
        "base ** (1 + alpha * i / n)",
        ("tests/test_mpi.py", "-k", "pipeline and 5-1-buffer"),
    ),
    Mutation(
        "resume: online network not loaded (back to random)",
        "mpirl/roles/learner_parts.py",
        '        t.online.load_state_dict(ts["online"])\n',
        "",
        ("tests/test_resume.py::test_resume_continues_counters_logs_and_learning",),
    ),
    Mutation(
        "logs: close without its final flush",
        "mpirl/logs/runlog.py",
        "            self.flush()\n            if self.mirror is not None:",
        "            if self.mirror is not None:",
        ("tests/test_errors.py::test_sigterm_stops_cleanly",),
    ),
    Mutation(
        "frames: look-ahead term halved",
        "mpirl/agent/frames.py",
        "extra = (stack - 1 + n_step) * envs_per_actor",
        "extra = (stack - 1 + n_step / 2) * envs_per_actor",
        ("tests/test_images.py::test_frame_replay_memory_figure",),
    ),
    Mutation(
        "placement: a comment after each Hydra host",
        "mpirl/placement.py",
        'body = [f"{h}:{n}" if fmt == "hydra"',
        'body = [f"{h}:{n} # scratch" if fmt == "hydra"',
        ("tests/test_placement.py::test_hydra_fills_generated_hostfile",),
    ),
    Mutation(
        "buffer: samples with beta of update 0",
        "mpirl/roles/placements/at_buffer.py",
        "beta = beta_at(cfg, self.learner_updates)",
        "beta = beta_at(cfg, 0)",
        ("tests/test_figures.py::test_buffers_sample_with_the_learners_beta",),
    ),
    Mutation(
        "buffer: sampling ignores the replay ratio",
        "mpirl/roles/placements/at_buffer.py",
        "and self.limiter.may_sample()",
        "and True",
        ("tests/test_figures.py", "-k", "replay_ratio and buffer"),
    ),
    Mutation(
        "config: gamma range unchecked",
        "mpirl/run/config.py",
        "if not 0 < c.gamma <= 1:",
        "if False:",
        ("tests/test_errors.py", "-k", "one_clear_error and gamma"),
    ),
    Mutation(
        "link: weights queue like any message (no latest-wins slot)",
        "mpirl/transport/link.py",
        "        if self._slot is not None:\n            self.latest_replaced += 1\n"
        "        self._slot = (tag, buf, on_commit, now)\n        self.poll(now)\n"
        "        return self._slot is None",
        "        if on_commit is not None:\n            on_commit()\n"
        "        self.post(buf, tag, now)\n        return True",
        ("tests/test_weights_link.py", "-k", "over_mpi"),
    ),
    Mutation(
        "link: a weight broadcast goes whole (no pieces)",
        "mpirl/transport/link.py",
        "            c = self.piece_bytes() or max(1, buf.nbytes)",
        "            c = max(1, buf.nbytes)",
        ("tests/test_weights_link.py", "-k", "piece"),
    ),
    Mutation(
        "link: pieces handed over unjoined",
        "mpirl/transport/link.py",
        "                buf = np.concatenate([*self._parts.pop(tag), buf])",
        "                self._parts.pop(tag)",
        ("tests/test_weights_link.py", "-k", "piece"),
    ),
    Mutation(
        "switch: starts in GBA (not allreduce's updates with no straggler)",
        "mpirl/roles/group_lead.py",
        'self.how = ALLREDUCE if mode in ("allreduce", "switch") else SUBMIT',
        'self.how = ALLREDUCE if mode == "allreduce" else SUBMIT',
        (
            "tests/test_learner_group.py::"
            "test_switch_without_a_straggler_makes_exactly_the_updates_of_allreduce",
        ),
    ),
]


def scratch_copy(dest: Path) -> None:
    """The working tree's tracked and untracked-but-not-ignored files."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def pytest(copy: Path, args: tuple[str, ...], env: dict) -> tuple[int, float, str]:
    t0 = time.monotonic()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            *args,
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = p.stdout.splitlines()
    why = [x[1:].strip() for x in lines if x.startswith("E ")][:1]  # the first failing line
    last = [x for x in lines if x.strip()][-1:] or [p.stderr[-200:]]
    return p.returncode, time.monotonic() - t0, (why or last)[0][:160]


def main(words: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not words or any(w in m.name for w in words)]
    with tempfile.TemporaryDirectory(prefix="mpirl-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        scratch_copy(copy)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                x for x in (str(copy), os.environ.get("PYTHONPATH")) if x
            ),
        }
        where = subprocess.run(
            [sys.executable, "-c", "import mpirl; print(mpirl.__file__)"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert where.stdout.strip().startswith(str(copy)), where.stdout
        rows = []
        for m in chosen:
            target = copy / m.path
            text = target.read_text()
            assert text.count(m.old) == 1, f"{m.name}: the text to change is not there once"
            rc0, t0, last0 = pytest(copy, m.tests, env)
            if rc0 != 0:
                rows.append((m.name, "BASELINE FAILS", t0, last0))
            else:
                target.write_text(text.replace(m.old, m.new))
                try:
                    rc, t, last = pytest(copy, m.tests, env)
                finally:
                    target.write_text(text)
                rows.append(
                    (
                        m.name,
                        "caught" if rc == 1 else ("MISSED" if rc == 0 else f"error (exit {rc})"),
                        t,
                        last,
                    )
                )
            print(f"{rows[-1][1]:>15}  {m.name}  ({rows[-1][2]:.0f} s: {rows[-1][3]})", flush=True)
    print("\n| mutation | tests | result | time | first failing line |\n|---|---|---|---|---|")
    for m, (name, verdict, t, why) in zip(chosen, rows, strict=True):
        why = why.replace("|", "\\|")
        print(f"| {name} | `{' '.join(m.tests)}` | {verdict} | {t:.0f} s | `{why}` |")
    return 0 if all(r[1] == "caught" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
