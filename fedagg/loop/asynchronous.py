"""The asynchronous driver (`server=async`): clients in flight, and their arrivals in simulated time.

`concurrency` C clients are in flight. At the start C clients are sent server version 0; a client sent at time t
arrives at t + `Clock.duration(client, its local steps, the bits it sends up, its dispatch number)`. Arrivals
wait in an event queue keyed by (arrival time, dispatch number), so ties resolve the same way in every run. An
arrival goes into the rule's buffer; `buffer_size` arrivals (1 for FedAsync, K for FedBuff) make one server step,
which is one round for the loop (`RoundLoop.end`: aggregate, evaluate, files, checkpoint; `rounds`, `eval_every`
and `checkpoint_every` count server steps). When every arrival at an instant is handled, as many idle clients
are sent the current model: the run's `sampler` chooses them among the idle online clients, as one step numbered by
the first dispatch n it starts, from the stream (seed, "dispatch", n) (`Draw.stream`; never the synchronous rounds'
"sampling"), so runs that differ only in their rule send the same clients while their clocks agree. The uniform
sampler (the default) draws as this server always did; Power-of-Choice scores its candidates with the current
model, the one they would be sent, and draws its first dispatch (the clients in flight at the start) uniformly.
A sampler that returns fewer clients than owed (clustered's clusters drawing one client twice, size's clients
without data) leaves the rest owed until the next arrival, as when too few clients are idle.
Arrivals at one instant are all taken before anyone is sent, so a client sent at time t gets the model of every
arrival up to t (with K = C clients that are all equally fast, FedBuff is then synchronous FedAvg).

A client trains on the model of the version it was sent, so its training may happen any time before it arrives:
the driver trains every client in flight that has not trained yet, all in one engine call (`train_rounds`, one
`RoundJob` per server version; the parallel engine stacks them), when the first of them arrives, and keeps each
result until its arrival. Each client draws its batches from its own count of trainings (`RoundJob.draws`), so
sent twice from one version it trains on other batches.

A checkpoint holds everything in flight (`AsyncServer.state_dict`): the clock's time, the queue, each client's
start version, dispatch number, arrival time and trained result (what is in flight is trained first, in the
uninterrupted run too, so both train the same groups), the buffer, the start models still needed and the
dispatches owed; the rule's own state is the aggregator's `state_dict`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor

from fedagg.aggregators.asynchronous import AsyncAggregator
from fedagg.sampling.pool import sampling_pool
from fedagg.engines.base import RoundJob, RoundResult
from fedagg.loop.drivers import drive
from fedagg.loop.round_loop import RoundLoop, RoundPlan
from fedagg.loop.timing import Timed


@dataclass
class Flight:
    """One dispatch of one client, from when it is sent until its update is in a server step."""

    dispatch: int  # the run's n-th dispatch (from 0): breaks ties of arrival times; names the clock's jitter draw
    client: int
    version: int  # the server version it was sent (its start model)
    sent: float  # simulated seconds
    arrives: float
    draw: int  # the client's n-th training (from 1): its batch stream
    trained: dict | None = None  # its row of the engine's result, once trained


class AsyncServer:
    def __init__(self, loop: RoundLoop, concurrency: int) -> None:
        if not isinstance(loop.fed.aggregator, AsyncAggregator):  # the server's `check` refused it before
            raise TypeError(f"server=async needs an asynchronous rule, not {type(loop.fed.aggregator).__name__}")
        self.loop, self.concurrency, self.rule = loop, concurrency, loop.fed.aggregator
        self.now = 0.0
        self.owed = concurrency  # clients to send once every arrival at `now` is handled
        self.waiting = False  # True: owed clients found nobody idle and online; they wait for the next arrival
        self.dispatches = 0
        self.queue: list[tuple[float, int]] = []  # (arrival time, dispatch number), a heap
        self.flights: dict[int, Flight] = {}  # by dispatch number: sent, not arrived
        self.buffer: list[Flight] = []  # arrived, not yet in a server step
        self.starts: dict[int, tuple[Tensor, Tensor]] = {}  # version -> (params, buffers) a flight started from
        self.draws = [0] * loop.settings.num_clients  # trainings per client so far
        self.sent_since: list[int] = []  # clients dispatched since the last server step: the bits sent down
        self.arrivals = 0  # every arrival so far, used or dropped: N of them make an epoch (`rule.flush_partial`)
        self.dropped_since: list[int] = []  # clients of the arrivals since the last step staler than `max_staleness`
        # the sampler's draws: a step per dispatch, numbered from 0, from their own stream
        self.draw = replace(loop.draw, stream="dispatch", first=0)
        if loop.resumed_schedule is not None:
            self.load_state_dict(loop.resumed_schedule)

    @property
    def version(self) -> int:
        """The server's model version: the server steps taken."""
        return self.loop.next_round - 1

    def step(self) -> None:
        """One event: an arrival at the current instant; else the dispatches it owes; else the clock moves on."""
        if self.queue and self.queue[0][0] <= self.now:
            self.arrive(heapq.heappop(self.queue)[1])
        elif self.owed and not self.waiting:
            self.dispatch()
        elif self.queue:
            self.now = self.queue[0][0]
        else:
            raise RuntimeError(f"server=async: at {self.now:g} simulated seconds no client is in flight and none is "
                               "idle and online to be sent")

    def arrive(self, dispatch: int) -> None:
        flight = self.flights.pop(dispatch)
        self.owed, self.waiting, self.arrivals = self.owed + 1, False, self.arrivals + 1
        if self.version - flight.version > self.rule.max_staleness:  # FLSim's cap: the update is not used
            self.dropped_since.append(flight.client)
            self.forget()
        else:
            if flight.trained is None:
                self.train([flight])
            self.buffer.append(flight)
            if len(self.buffer) == self.rule.buffer_size:
                self.server_step()
        if self.rule.flush_partial and self.buffer and self.arrivals % self.loop.settings.num_clients == 0:
            self.server_step()  # the epoch's end: what is buffered makes a (smaller) server step

    def dispatch(self) -> None:
        """Send the owed clients the current model: idle online clients, chosen by the sampler."""
        loop, fed, seed = self.loop, self.loop.fed, self.loop.settings.seed
        v = self.version
        online = fed.system.online(seed, v + 1, loop.settings.num_clients)
        pool = sampling_pool(loop.settings, online)
        busy = torch.tensor(sorted({f.client for f in self.flights.values()}), dtype=pool.dtype)
        idle = pool[~torch.isin(pool, busy)]  # ascending, as the pool
        chosen = fed.sampler.choose(self.owed, idle, self.dispatches, self.draw)
        self.owed -= len(chosen)
        self.waiting = self.owed > 0
        if chosen and v not in self.starts:
            self.starts[v] = (loop.params, loop.buffers)
        for i in chosen:
            d, self.dispatches = self.dispatches, self.dispatches + 1
            self.draws[i] += 1
            arrives = self.now + fed.clock.duration(i, fed.trainer.steps(fed.clients[i]), loop.bits.up_each(i), d)
            self.flights[d] = Flight(d, i, v, self.now, arrives, self.draws[i])
            heapq.heappush(self.queue, (arrives, d))
            self.sent_since.append(i)

    def train(self, extra: list[Flight] = ()) -> None:
        """Every client in flight that has not trained (and `extra`), in one engine call: one job per version."""
        pending = sorted([f for f in self.flights.values() if f.trained is None] + list(extra),
                         key=lambda f: f.dispatch)
        if not pending:
            return
        fed, loop = self.loop.fed, self.loop
        by_version: dict[int, list[Flight]] = {}
        for f in pending:
            by_version.setdefault(f.version, []).append(f)
        jobs = []
        for v, flights in by_version.items():
            chosen = [fed.clients[f.client] for f in flights]
            params, buffers = self.starts[v]
            jobs.append(RoundJob(fed.model, fed.trainer, fed.data, chosen, params, buffers,
                                 lr=fed.trainer.lr_at(v + 1, loop.settings.rounds), seed=loop.settings.seed,
                                 round=v + 1, val_indices=loop.provider.val_indices(chosen),
                                 draws=[f.draw for f in flights]))
        for flights, result in zip(by_version.values(), fed.engine.train_rounds(jobs)):
            for k, f in enumerate(flights):
                f.trained = row_of(result, k)

    def server_step(self) -> None:
        """The buffered arrivals into one server step: a round of the loop."""
        loop, fed = self.loop, self.loop.fed
        arrivals, self.buffer = self.buffer, []
        v = self.version
        ids = [f.client for f in arrivals]
        staleness = [v - f.version for f in arrivals]
        starts = torch.stack([self.starts[f.version][0] for f in arrivals])
        self.forget()
        result = stack_rows([f.trained for f in arrivals])
        # down at each dispatch, up at each arrival (a dropped one was uploaded too)
        bits = loop.bits.count(self.sent_since, ids + self.dropped_since)
        dropped, self.sent_since, self.dropped_since = len(self.dropped_since), [], []
        lr = fed.trainer.lr_at(v + 1, loop.settings.rounds)
        chosen = [fed.clients[i] for i in ids]
        job = RoundJob(fed.model, fed.trainer, fed.data, chosen, loop.params, loop.buffers, lr=lr,
                       seed=loop.settings.seed, round=v + 1)
        timed = Timed(ids, None, self.now - loop.times.sim_time, 0)  # the clock's totals move on to `now`
        columns = {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness)}
        if self.rule.max_staleness != math.inf:
            columns["dropped_stale"] = dropped  # arrivals since the last step that were too stale to use
        loop.end(RoundPlan(v + 1, ids, None, bits, lr, job, timed, starts, staleness, columns), result)

    def forget(self) -> None:
        """Drop the start models no flight and no buffered arrival needs any more."""
        used = {f.version for f in self.flights.values()} | {f.version for f in self.buffer}
        self.starts = {v: start for v, start in self.starts.items() if v in used}

    # -- checkpoints (RoundLoop.state) ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.loop.summary["status"] != "completed":  # a resumed run finds every flight trained, as this one does
            self.train()
        return {"now": self.now, "owed": self.owed, "waiting": self.waiting, "dispatches": self.dispatches,
                "queue": list(self.queue), "flights": [asdict(f) for f in self.flights.values()],
                "buffer": [asdict(f) for f in self.buffer], "starts": dict(self.starts), "draws": list(self.draws),
                "sent_since": self.sent_since, "concurrency": self.concurrency, "arrivals": self.arrivals,
                "dropped_since": self.dropped_since}

    def load_state_dict(self, state: dict) -> None:
        self.now, self.owed, self.waiting = state["now"], state["owed"], state["waiting"]
        self.dispatches, self.queue = state["dispatches"], [tuple(e) for e in state["queue"]]
        heapq.heapify(self.queue)
        self.flights = {f["dispatch"]: Flight(**f) for f in state["flights"]}
        self.buffer = [Flight(**f) for f in state["buffer"]]
        self.starts, self.draws = dict(state["starts"]), list(state["draws"])
        # older checkpoints counted these clients without their ids: counted as client 0 (equal unless adapter ranks
        # differ by client)
        self.sent_since, self.dropped_since = (s if isinstance(s, list) else [0] * s for s in
                                               (state["sent_since"], state.get("dropped_since", 0)))
        self.arrivals = state.get("arrivals", 0)  # older: none


def row_of(result: RoundResult, k: int) -> dict:
    """Client k's share of an engine's result, copied (a view would keep the whole job's tensors, in memory and in
    checkpoints)."""
    def take(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[k].clone()

    return {"params": take(result.params), "buffers": take(result.buffers), "train_loss": take(result.train_loss),
            "val_acc": take(result.val_acc), "local_steps": take(result.local_steps),
            "payloads": {key: take(t) for key, t in result.payloads.items()}, "sensitivity": take(result.sensitivity)}


def stack_rows(rows: list[dict]) -> RoundResult:
    """The arrivals' rows as one result, in arrival order."""
    def stacked(key: str) -> Tensor | None:
        return None if rows[0][key] is None else torch.stack([r[key] for r in rows])

    return RoundResult(params=stacked("params"), buffers=stacked("buffers"), train_loss=stacked("train_loss"),
                       val_acc=stacked("val_acc"), local_steps=stacked("local_steps"),
                       payloads={key: torch.stack([r["payloads"][key] for r in rows]) for key in rows[0]["payloads"]},
                       sensitivity=stacked("sensitivity"))


def run_async(loop: RoundLoop, concurrency: int) -> dict:
    """The run's remaining server steps on the asynchronous server; its summary (as `run_alone`'s)."""
    server = AsyncServer(loop, concurrency)
    loop.schedule = server
    return drive(loop, server.step)
