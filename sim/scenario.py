"""A simulated run's parameters.  ``Scenario.random(seed)`` derives them all
from the seed, so a seed alone replays a run; hypothesis may also draw them
(``scenarios()``), and ``replay_command()`` prints the exact CLI to rerun."""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class Scenario:
    seed: int = 0
    mode: str = "unbounded"      # "unbounded" (terms) | "classic" (fence, close)
    bookies: int = 4             # in the cluster (>= E; the rest are spares)
    E: int = 3
    Qw: int = 3
    Qa: int = 2
    clients: int = 2             # would-be writers (duelling)
    max_terms: int = 4           # take-overs stop at this term
    entries: int = 6             # adds per writer term
    window: int = 4              # WriterCore max_pending
    read_ahead: int = 1024       # RecoveryCore max_read_ahead (1: one entry at a time)
    rec_writes: int = 1000       # RecoveryCore max_inflight_writes
    roll_entries: int = 0        # WriterCore fragment_max_entries (0: no rolling)
    p_loss: float = 0.02         # per message
    delay_min: int = 1
    delay_max: int = 10
    p_slow: float = 0.05         # a message is late: delay_max..slow_max
    slow_max: int = 150
    timeout: int = 60            # client request timeout
    fsync_min: int = 0
    fsync_max: int = 4
    crashes: int = 2             # bookie crashes in the run
    max_down: int = 1            # bookies down at once
    restart_min: int = 20
    restart_max: int = 300
    client_crashes: int = 1
    partitions: int = 0          # client<->bookie links cut for a while
    partition_min: int = 20
    partition_max: int = 300
    takeover_mean: int = 250     # mean time between a client's take-over attempts
    add_interval: int = 8        # mean time between a writer's adds
    reads: int = 8               # reader reads in the run
    meta_delay: int = 5          # metadata round trip
    horizon: int = 2500          # no new activity after this time
    max_steps: int = 200_000     # events; a run must end

    @classmethod
    def random(cls, seed: int, **overrides) -> "Scenario":
        """Every parameter from the seed (then ``overrides``)."""
        r = random.Random(f"scenario/{seed}")
        mode = "classic" if r.random() < 0.2 else "unbounded"
        E = r.choice((3, 3, 3, 4))
        Qw = E if r.random() < 0.7 else E - 1
        Qa = r.choice([q for q in (2, 3) if q <= Qw] or [Qw])
        if r.random() < 0.1:
            Qa = Qw
        sc = cls(
            seed=seed, mode=mode, bookies=E + r.choice((0, 1, 1, 2)), E=E, Qw=Qw, Qa=Qa,
            clients=r.choice((2, 2, 3)), max_terms=r.randint(2, 7), entries=r.randint(1, 12),
            window=r.randint(1, 6), roll_entries=r.choice((0, 0, 0, 2, 4, 8)),
            p_loss=r.choice((0.0, 0.01, 0.03, 0.08)),
            delay_max=r.choice((3, 10, 25)), p_slow=r.choice((0.0, 0.05, 0.15)),
            timeout=r.choice((40, 60, 120)), fsync_max=r.choice((0, 2, 6)),
            crashes=r.randint(0, 3), max_down=r.choice((1, 1, 2)), client_crashes=r.randint(0, 2),
            partitions=r.choice((0, 1, 3, 6)),
            takeover_mean=r.choice((60, 150, 400, 800)), add_interval=r.choice((2, 8, 20)), reads=r.randint(2, 12),
            read_ahead=r.choice((1, 2, 4, 16, 16)), rec_writes=r.choice((1, 2, 1000, 1000)),
        )
        return replace(sc, **overrides)

    @classmethod
    def reuse(cls, seed: int) -> "Scenario":
        """A profile that re-uses bookies: one spare, many partitions, slow
        messages (it finds the re-used-bookie divergence, see sim/scripted.py
        ``reused_bookie``, at seed 7358)."""
        sc = cls.random(seed)
        return replace(sc, mode="unbounded", bookies=sc.E + 1, partitions=8, p_slow=0.2, window=6,
                       roll_entries=0, crashes=0, client_crashes=0, p_loss=0.02, max_terms=6, entries=10)

    def replay_command(self) -> str:
        base = Scenario.random(self.seed)
        extra = [f"--set {f.name}={getattr(self, f.name)}" for f in fields(self)
                 if f.name != "seed" and getattr(self, f.name) != getattr(base, f.name)]
        return " ".join(["python -m sim --seed", str(self.seed), *extra, "--trace"])

    def as_dict(self) -> dict:
        return asdict(self)


def parse_override(text: str) -> tuple[str, object]:
    """'name=value' for --set, typed like the field."""
    name, _, value = text.partition("=")
    types = {f.name: f.type for f in fields(Scenario)}
    if name not in types:
        raise ValueError(f"unknown scenario field {name!r}")
    t = types[name]
    return name, (float(value) if t in ("float", float) else value if t in ("str", str) else int(value))
