"""Prometheus metrics of a server (its own registry): requests, latency, group commits and
samples learned over every learner; the learner ``default``'s figures under the names of a
single-learner server; every learner's figures with a ``learner`` label."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from ciosl.serve.hub import DEFAULT, Hub

PER_LEARNER = (("seen", "samples the learner has seen"), ("classes", "classes learned"),
               ("seq", "last log record"), ("loaded", "1 when loaded in memory"),
               ("feedback", "feedback rows scored (the live score)"),
               ("accuracy", "live accuracy of the answers corrected since start"),
               ("skipped", "records of the log skipped: they failed to apply (--log nats)"))
# the rest of the live score, for the learners loaded (from their score, not their snapshot)
LIVE = (("accuracy_last", "live accuracy over the last --feedback-window corrections"),
        ("new_class_rate", "corrections to a class new at the time answered as a known one"),
        ("new_class_auroc", "AUROC of the novelty score for classes new at the time"))


class _Learners:
    """Every learner's figures, labelled by name (a learner not loaded: its last known)."""

    def __init__(self, hub: Hub):
        self.hub = hub

    def collect(self):
        families = {k: GaugeMetricFamily(f"ciosl_learner_{k}", text, labels=["learner"])
                    for k, text in PER_LEARNER}
        live = {k: GaugeMetricFamily(f"ciosl_learner_{k}", text, labels=["learner"])
                for k, text in LIVE}
        recall = GaugeMetricFamily("ciosl_learner_recall", "live recall per true label",
                                   labels=["learner", "label"])
        names = self.hub.names()
        for name in names:
            try:
                row = self.hub.row(name)
            except (OSError, ValueError):  # deleted meanwhile
                continue
            for key, family in families.items():
                value = row.get(key, 0 if key == "skipped" else None)
                if value is not None:
                    family.add_metric([name], float(value))
            entry = self.hub._entries.get(name)
            service = entry.service if entry is not None else None
            if service is None or not service.score.n:
                continue
            with service.score_lock:
                fig = service.score.figures()
            for key, value in (("accuracy_last", fig["accuracy_last"]),
                               ("new_class_rate", fig["new_class"]["rate"]),
                               ("new_class_auroc", fig["new_class"]["auroc"])):
                if value is not None:
                    live[key].add_metric([name], float(value))
            for label, value in fig["recall"].items():
                recall.add_metric([name, label], float(value))
        yield from families.values()
        yield from live.values()
        yield recall
        yield GaugeMetricFamily("ciosl_learners", "learners the server holds", value=len(names))
        yield GaugeMetricFamily("ciosl_learners_loaded", "learners loaded in memory (the "
                                "others are loaded on their next request)",
                                value=self.hub.loaded())


class Metrics:
    def __init__(self, hub: Hub):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ciosl_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("ciosl_request_seconds", "request latency by endpoint",
                                 ["endpoint"], registry=r,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5,
                                          1, 2.5, 5, 10))
        self.learned = Counter("ciosl_samples_learned", "samples learned and acknowledged",
                               registry=r)
        self.fsync = Histogram("ciosl_log_fsync_seconds", "write + fsync of one group commit",
                               registry=r, buckets=(.0001, .0005, .001, .0025, .005, .01, .025,
                                                    .05, .1, .25, 1))
        self.group = Histogram("ciosl_group_requests", "learn requests per group commit",
                               registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))

        def default(key):
            def read():
                entry = hub._entries.get(DEFAULT)
                service = entry.service if entry is not None else None
                if service is None:
                    return 0.0
                return {"age": lambda: time.time() - service.snap_time,
                        "classes": lambda: len(service.learner.classes_),
                        "seen": lambda: service.learner.n_seen_,
                        "seq": lambda: service.seq}[key]()
            return read

        for name, text, key in (
                ("ciosl_snapshot_age_seconds", "seconds since the last snapshot", "age"),
                ("ciosl_classes", "classes learned", "classes"),
                ("ciosl_samples_seen", "samples the learner has seen", "seen"),
                ("ciosl_log_seq", "last acknowledged log record", "seq")):
            Gauge(name, f"{text} (the learner 'default')", registry=r).set_function(
                default(key))
        r.register(_Learners(hub))

    def on_commit(self, seconds: float, requests: int, samples: int) -> None:
        self.fsync.observe(seconds)
        self.group.observe(requests)
        self.learned.inc(samples)
