"""Every HDF5 stream mpirl writes, declared once: name, doc, and each field's dtype, units and
meaning, per role.

The roles open their streams from here (`open_streams`), so a logged field is added in one place:
append a `Field` to its stream below and pass the value in the role's ``append``.  The tables of
docs/hdf5.md are generated from the files the roles write (``python -m analysis.schema RUN_DIR
--update docs/hdf5.md``), and ``tests/test_schema.py`` checks that every stream and field declared
here is in docs/hdf5.md with the same doc text, without a run.

Every stream also has ``t`` first (`mpirl.logs.runlog.T_FIELD`), added by
`mpirl.logs.runlog.RunLog.stream`.
"""

from __future__ import annotations

from typing import NamedTuple

from mpirl.logs.runlog import Field, RunLog
from mpirl.logs.runlog import Stream as LogStream


class Stream(NamedTuple):
    """One stream of one role's file: ``/<name>`` with ``fields`` (``t`` is added first)."""

    name: str
    doc: str
    fields: tuple[Field, ...]


LEARNER = (
    Stream(
        "updates",
        "one row per learner update",
        (
            Field("update", "i8", "", "update number"),
            Field("loss", "f4", "", "weighted Huber loss of the update"),
            Field(
                "loss_unweighted",
                "f4",
                "",
                "the same Huber loss with every importance weight 1 (from the batch's |td|)",
            ),
            Field("td_abs_mean", "f4", "", "mean |td| of the batch"),
            Field(
                "td_abs_uniform",
                "f4",
                "",
                "the same |td| weighted by 1 / what each sample was drawn in proportion to (PER's "
                "p_i; thinned: p_i f_i), self-normalized: an estimate of the mean |td| over the "
                "memory the batch came from (thinned: over every produced transition), what a "
                "uniform draw would have met; td_abs_mean / it is the concentration by "
                "prioritized sampling, the same figure in every placement (NaN where not known: "
                "a group's other learners)",
            ),
            Field("beta", "f4", "", "importance-weight exponent used"),
        ),
    ),
    Stream(
        "transfers",
        "every message of experiences that crossed the link toward the learner",
        (
            Field("buffer", "i4", "", "site of the buffer that sent it"),
            Field("update", "i8", "", "learner updates so far when it was used / arrived"),
            Field(
                "kind",
                "i4",
                "",
                "5 = sampled batch (replay_at=buffer), 4 = forwarded experiences "
                "(replay_at=learner or thinned)",
            ),
            Field("n", "i8", "transitions", "experiences in the message"),
            Field("nbytes", "i8", "bytes", "message size on the link"),
            Field(
                "raw_nbytes",
                "i8",
                "bytes",
                "message size before compression (= nbytes when it was not compressed)",
            ),
            Field(
                "priority_mean",
                "f4",
                "",
                "mean priority the sender held for them: p=(|td|+eps)"
                "^alpha from the buffer's memory, or from the actors' initial |td|",
            ),
            Field(
                "priority_td_mean",
                "f4",
                "",
                "the same priorities in PER's (and the paper's) "
                "unit, |td|+eps = p^(1/alpha), averaged over the n (NaN when alpha is 0)",
            ),
            Field("priority_median", "f4", "", "median of those priorities (all n)"),
            Field(
                "priority_p90",
                "f4",
                "",
                "90th percentile of those priorities (all n; numpy's linear interpolation)",
            ),
            Field(
                "arrival_td_mean",
                "f4",
                "",
                "mean |td| under the learner's network on arrival, "
                "over a random subsample of min(n, --arrival-sample) of them (NaN with 0)",
            ),
            Field("arrival_priority_mean", "f4", "", "mean (|td|+eps)^alpha of the same subsample"),
            Field("arrival_n", "i4", "transitions", "size of that subsample"),
            Field(
                "window",
                "i4",
                "batches",
                "the sending buffer's in-flight window when it sent "
                "the batch (replay_at=buffer; 0 for forwarded experiences)",
            ),
        ),
    ),
    Stream(
        "evals",
        "greedy evaluations (eval_episodes episodes each), one row per finished evaluation",
        (
            Field("update", "i8", "", "learner updates so far"),
            Field("env_steps", "i8", "steps", "env steps of all actors so far"),
            Field("ret_mean", "f8", "reward", "greedy evaluation mean return"),
            Field("ret_std", "f8", "reward", "std of the evaluation returns"),
            Field("ret_min", "f8", "reward", "worst evaluation return"),
            Field("eval_s", "f8", "s", "wall time the evaluation ran (in the --evaluator runner)"),
            Field(
                "lag_updates",
                "i8",
                "",
                "updates trained between taking the weights (update) and handling the result (t)",
            ),
            Field(
                "reference_loss",
                "f8",
                "",
                "unweighted Huber TD loss of the evaluated weights "
                "(their own target) on the --reference-set (NaN without one)",
            ),
            Field("reference_td_abs_mean", "f8", "", "mean |td| on the --reference-set"),
            Field(
                "reference_q_sq_mean",
                "f8",
                "",
                "mean Q(s,a)^2 of the evaluated weights on the "
                "--reference-set: the Q scale (reference_loss / it compares runs whose Q grew "
                "differently)",
            ),
        ),
    ),
    Stream(
        "progress",
        "one row per progress interval",
        (
            Field("env_steps", "i8", "steps", "env steps of all actors"),
            Field("updates", "i8", "", "learner updates"),
            Field("env_steps_per_s", "f8", "steps/s", "over the last interval"),
            Field("updates_per_s", "f8", "1/s", "over the last interval"),
            Field("recent_return", "f8", "reward", "mean of the actors' last 100 episode returns"),
            Field("loss", "f8", "", "mean loss over the interval"),
            Field("busy_fraction", "f4", "", "time training / wall time over the interval"),
            Field("link_bytes_per_s", "f8", "bytes/s", "both directions, all buffers"),
            Field("interval_s", "f8", "s", "length of the interval the rates are over"),
            Field(
                "rho",
                "f8",
                "",
                "samples per produced transition over the interval: transitions the learners "
                "trained on (every learner's batches) / env steps (what --learner-updates-per-s "
                "and --actor-steps-per-s set; NaN when no env steps were reported)",
            ),
            Field(
                "delivered_fraction",
                "f8",
                "",
                "replay_at=learner or thinned: transitions inserted into "
                "the learner's memory / env steps produced, over the interval (< 1: the link or "
                "--forward-overflow drop-oldest lost some, or thinned left them at the edge; NaN "
                "for replay_at=buffer)",
            ),
            Field(
                "sampled",
                "i8",
                "transitions",
                "transitions the learners trained on since the run began (every learner's "
                "batches), at the row; the export's rho is its difference across a window over "
                "the env steps the buffers' /site rows count in it (env_steps here lag in 0.25 s "
                "step reports)",
            ),
            Field(
                "delivered",
                "i8",
                "transitions",
                "replay_at=learner or thinned: transitions inserted into the learner's memory "
                "since the run began, at the row (-1 for replay_at=buffer); the export's "
                "delivered fraction is the buffers' /site forwarded over their env_steps instead "
                "(both counted at the buffer: env_steps here lag in 0.25 s step reports)",
            ),
            Field(
                "capped_s",
                "f8",
                "s",
                "time a batch was ready but --learner-updates-per-s held "
                "the update back, over the interval (the cap, not the data, set the pace)",
            ),
            Field(
                "idle_fraction",
                "f4",
                "",
                "time the learner slept because a turn found nothing "
                "to do (no batch ready, no message) / wall time over the interval",
            ),
            Field(
                "rss_bytes",
                "i8",
                "bytes",
                "the learner process's resident memory at the row (-1 where /proc is missing)",
            ),
            Field(
                "sync_mode",
                "i1",
                "",
                "how the learners make updates at the row: 0 = synchronously (one learner, or "
                "all-reduce), 1 = GBA or async (--learner-sync switch moves between them)",
            ),
            Field(
                "weights_interval",
                "f8",
                "",
                "learner updates between weight broadcasts over the "
                "interval (the effective --weights-every; NaN with fewer than two)",
            ),
            Field(
                "weights_bytes",
                "f8",
                "bytes",
                "mean size of a weight message that entered a "
                "link in the interval (--weights-encoding; keyframes included)",
            ),
            Field(
                "weights_sent",
                "i8",
                "messages",
                "weight messages that entered the links in the "
                "interval (one per site per broadcast that was not replaced)",
            ),
            Field("weights_keyframes", "i8", "messages", "of those, full keyframes"),
            Field(
                "weights_replaced",
                "i8",
                "messages",
                "broadcasts a newer one replaced before they left (latest wins), all sites, so far",
            ),
            Field(
                "lag_min",
                "f8",
                "",
                "policy lag: least learner updates between the learner's "
                "count when a site's STATS arrived and the weights an actor of it acts with, over "
                "every actor of every site and the "
                "interval (NaN without STATS)",
            ),
            Field(
                "lag_median",
                "f8",
                "",
                "median of that lag over the interval (the progress line's 'lag')",
            ),
            Field("lag_max", "f8", "", "largest of that lag over the interval"),
        ),
    ),
    Stream(
        "lag",
        "policy lag per actor: one row per actor a site's STATS reports on (4 a second per site)",
        (
            Field("buffer", "i4", "", "site"),
            Field("actor", "i4", "", "the actor's rank in its site (1..)"),
            Field(
                "lag_updates",
                "i8",
                "updates",
                "learner updates when the STATS arrived minus those of the weights the actor "
                "acted with in its latest experiences",
            ),
        ),
    ),
    Stream(
        "link",
        "the learner's side of each long-haul link, one row per buffer per interval",
        (
            Field("buffer", "i4", "", "site"),
            Field("bytes_in", "i8", "bytes", "bytes received from the buffer in the interval"),
            Field("msgs_in", "i8", "messages", "messages received from the buffer"),
            Field("bytes_out", "i8", "bytes", "bytes sent to the buffer"),
            Field("msgs_out", "i8", "messages", "messages sent to the buffer"),
            Field("queue_s", "f8", "s", "summed time messages waited for the modelled bandwidth"),
            Field("interval_s", "f8", "s", "length of the interval"),
            Field(
                "utilization",
                "f4",
                "",
                "fraction of the interval the learner->buffer side was "
                "busy at the modelled bandwidth (0 without emulation)",
            ),
        ),
    ),
    Stream(
        "group",
        "--learners K > 1: one row per gradient contribution to an update (allreduce: "
        "one row per update for the whole group)",
        (
            Field("update", "i8", "", "the update it went into (or was dropped at)"),
            Field(
                "learner", "i4", "", "learner that computed it (0 = the lead; -1 = all, allreduce)"
            ),
            Field(
                "staleness",
                "i4",
                "updates",
                "gba: updates applied since the update its token was for (0 when early); "
                "async: as lag",
            ),
            Field(
                "lag",
                "i4",
                "updates",
                "updates applied between the weights it was computed on and its update",
            ),
            Field("samples", "i8", "transitions", "samples in it"),
            Field(
                "scale",
                "f4",
                "",
                "weight it was applied with: gba 1 up to --severe-staleness, "
                "1/(1+staleness-severe) beyond; 1 otherwise; 0 when dropped",
            ),
            Field(
                "wait_s",
                "f8",
                "s",
                "allreduce: the lead's wait in the Allreduce; async / gba: "
                "from the first contribution's arrival to the update",
            ),
            Field("dropped", "i1", "", "1 = dropped as too stale (--max-grad-staleness)"),
        ),
    ),
    Stream(
        "switches",
        "--learner-sync switch: one row per switch between synchronous (all-reduce) and GBA "
        "updates, with the learners' compute times that decided it",
        (
            Field("update", "i8", "", "the update count at the switch"),
            Field("to_gba", "i1", "", "1 = to GBA (a learner straggles), 0 = back to all-reduce"),
            Field(
                "ratio",
                "f8",
                "",
                "the slowest learner's median compute time per batch over the median of the "
                "others', each divided by that learner's baseline (its best median so far; to "
                "GBA above 1.5, back below 1.2)",
            ),
            Field("slowest", "i4", "", "the slowest learner (0 = the lead)"),
            Field("slowest_s", "f8", "s", "its median compute time per batch"),
            Field("others_s", "f8", "s", "the median of the other learners' medians"),
        ),
    ),
)

BUFFER = (
    Stream(
        "link",
        "this buffer's side of the long-haul link, one row per interval",
        (
            Field("bytes_out", "i8", "bytes", "bytes sent toward the learner in the interval"),
            Field(
                "raw_bytes_out",
                "i8",
                "bytes",
                "the same messages before compression (= bytes_out when --compress is off)",
            ),
            Field("msgs_out", "i8", "messages", "messages sent toward the learner"),
            Field("bytes_in", "i8", "bytes", "bytes received from the learner"),
            Field("msgs_in", "i8", "messages", "messages received from the learner"),
            Field("queue_s", "f8", "s", "summed time messages waited for the modelled bandwidth"),
            Field("interval_s", "f8", "s", "length of the interval"),
            Field(
                "utilization",
                "f4",
                "",
                "fraction of the interval the outgoing side was busy "
                "at the modelled bandwidth (0 without emulation)",
            ),
        ),
    ),
    Stream(
        "site",
        "buffer counters, one row per interval",
        (
            Field("env_steps", "i8", "steps", "env steps of this site's actors so far"),
            Field("inserted", "i8", "transitions", "transitions received from actors so far"),
            Field("sampled", "i8", "transitions", "transitions sent as batches (replay_at=buffer)"),
            Field("replay_size", "i8", "transitions", "items in this buffer's replay memory"),
            Field(
                "stale_dropped", "i8", "priorities", "priority updates dropped: slot overwritten"
            ),
            Field("forward_queue", "i8", "transitions", "transitions waiting to be forwarded"),
            Field("inflight", "i4", "batches", "sampled batches awaiting their priority update"),
            Field(
                "window", "i4", "batches", "batches allowed in flight (--inflight; auto: chosen)"
            ),
            Field("rtt_s", "f8", "s", "mean batch round trip in the interval (send -> update)"),
            Field("rtt_net_s", "f8", "s", "auto window's smoothed round trip on the wire"),
            Field("step_s", "f8", "s", "learner's time per update as it reports it"),
            Field(
                "too_stale",
                "i8",
                "priorities",
                "priority updates dropped: older than max_staleness batches",
            ),
            Field(
                "forward_dropped", "i8", "transitions", "dropped by --forward-overflow drop-oldest"
            ),
            Field(
                "forwarded",
                "i8",
                "transitions",
                "sent toward the learner (replay_at=learner or thinned): "
                "inserted = forwarded + forward_dropped + forward_queue + thinned",
            ),
            Field(
                "thinned",
                "i8",
                "transitions",
                "left at the edge by the thinning draw (replay_at=thinned; 0 otherwise)",
            ),
            Field(
                "thin_budget",
                "f4",
                "",
                "replay_at=thinned: the expected fraction forwarded now, min(1, rho-budget, "
                "link-budget) (docs/design.md, A third placement); NaN otherwise",
            ),
            Field("throttled", "i8", "tokens", "actor tokens held back so far (token control)"),
            Field(
                "prio_received",
                "i8",
                "priorities",
                "priority updates received from the learner "
                "so far (= prio_applied + stale_dropped + too_stale)",
            ),
            Field(
                "prio_applied",
                "i8",
                "priorities",
                "priority updates written into the replay memory so far",
            ),
            Field(
                "prio_moved",
                "f8",
                "",
                "sum over applied batches of |change of the memory's "
                "total priority| (0: the updates never changed what gets sampled)",
            ),
        ),
    ),
    Stream(
        "batches",
        "replay_at=buffer: every batch sampled and sent over the link",
        (
            Field("batch", "i8", "", "batch id"),
            Field("priority_mean", "f4", "", "mean priority p the memory held for the batch"),
            Field("size", "i8", "transitions", "replay memory size when sampled"),
            Field("beta", "f4", "", "importance-weight exponent the batch was sampled with"),
            Field(
                "max_weight",
                "f4",
                "",
                "the memory's largest importance weight relative to "
                "uniform sampling, (mean p / min p)^beta: the batch's weights are divided by it; "
                "the learner rescales to the largest of all sites'",
            ),
        ),
    ),
)

ACTOR = (
    Stream(
        "episodes",
        "episodes finished by this actor's envs",
        (
            Field("env", "i4", "", "env index within this actor"),
            Field("ret", "f8", "reward", "undiscounted episode return"),
            Field("length", "i8", "steps", "episode length"),
            Field("epsilon", "f4", "", "exploration rate of this env"),
        ),
    ),
    Stream(
        "actor",
        "actor counters, about once per flush",
        (
            Field("env_steps", "i8", "steps", "env steps by this actor so far"),
            Field("msgs_sent", "i8", "messages", "experience messages sent"),
            Field("bytes_sent", "i8", "bytes", "experience bytes sent"),
            Field("throttled_s", "f8", "s", "time spent waiting for a token (backpressure)"),
            Field("paced_s", "f8", "s", "time spent sleeping to hold --actor-steps-per-s"),
            Field("weights_version", "i8", "", "version of the weights in use"),
            Field(
                "weights_updates",
                "i8",
                "",
                "learner updates when the weights in use were made "
                "(policy lag = the learner's updates now minus this)",
            ),
        ),
    ),
)

LEARNER_WORKER = (
    Stream(
        "work",
        "learners 1..K-1 of a group: one row per batch the lead ordered",
        (
            Field("order", "i8", "", "order id (the lead numbers them)"),
            Field(
                "version", "i8", "", "updates applied on the weights the gradient was computed on"
            ),
            Field("samples", "i8", "transitions", "samples in the batch"),
            Field("loss", "f4", "", "weighted Huber loss of the batch"),
            Field(
                "compute_s",
                "f8",
                "s",
                "from the order's arrival to the answer (allreduce: the Allreduce included)",
            ),
            Field("wait_s", "f8", "s", "allreduce: the wait in the Allreduce (0 otherwise)"),
        ),
    ),
)

ROLES = {"learner": LEARNER, "buffer": BUFFER, "actor": ACTOR, "learner_worker": LEARNER_WORKER}


def open_streams(log: RunLog, role: str) -> dict[str, LogStream]:
    """Declare (or, on resume, reopen) every stream of ``role`` in ``log``: name -> stream."""
    return {s.name: log.stream(s.name, list(s.fields), doc=s.doc) for s in ROLES[role]}
