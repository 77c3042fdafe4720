"""How the server schedules its clients (`server` group): synchronous rounds, or asynchronous arrivals.

`server=sync` (the default) runs rounds: `fedagg.loop.drivers.run_alone`. `server=async server.concurrency=C`
keeps C clients in flight on the simulated clock and steps on arrivals (`fedagg.loop.asynchronous.run_async`);
it needs a clock and an asynchronous rule (`Aggregator.asynchronous`: FedAsync, FedBuff). Each mode refuses,
in one line and before anything is loaded, what it cannot run (`check`), and drives a prepared run (`drive`):
the run picks its driver from its mode, never from its method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar

from fedagg.config.constraints import Range, checked
from fedagg.system.base import System

if TYPE_CHECKING:
    from fedagg.config.settings import Settings
    from fedagg.loop.federation import Parts
    from fedagg.loop.round_loop import RoundLoop

ASYNC_RULES = "aggregator=fedasync or aggregator=fedbuff"
CLOCKS = "clock=lognormal, half_normal, exponential or uniform"


def _rule(parts: Parts) -> str:
    chosen = parts.choices.get("aggregator")
    return f"aggregator={chosen}" if chosen else f"aggregator {type(parts.aggregator).__name__}"


class Synchronous:
    """`server=sync`: rounds of sampled clients, all from the round's global model."""

    asynchronous: ClassVar[bool] = False

    def check(self, parts: Parts, settings: Settings) -> None:
        if parts.aggregator.asynchronous:
            raise ValueError(f"{_rule(parts)} is not allowed with server=sync (the default): it is a rule of an "
                             f"asynchronous server; add server=async and a clock ({CLOCKS})")

    def per_step(self, settings: Settings) -> tuple[int, str]:
        """The most clients the sampler chooses at once, and the setting that says so (for its refusals)."""
        return settings.per_round, "clients_per_round"

    def drive(self, loop: RoundLoop) -> dict:
        from fedagg.loop.drivers import run_alone

        return run_alone(loop)


class Asynchronous:
    """`server=async`: `concurrency` clients in flight; an arrival goes to the rule, an idle client the sampler
    chooses takes its place."""

    asynchronous: ClassVar[bool] = True

    @checked("server.")
    def __init__(self, concurrency: Annotated[int, Range(ge=1, integer=True)] = 10) -> None:
        self.concurrency = concurrency

    def check(self, parts: Parts, settings: Settings) -> None:
        if not parts.aggregator.asynchronous:
            raise ValueError(f"{_rule(parts)} is not allowed with server=async: it aggregates synchronous rounds; "
                             f"use {ASYNC_RULES}, or server=sync")
        if not parts.clock.enabled:
            raise ValueError(f"clock={parts.choices.get('clock', 'none')} is not allowed with server=async: arrivals "
                             f"need simulated time; choose {CLOCKS}")
        if parts.clock.deadline is not None:
            raise ValueError(f"clock.deadline={parts.clock.deadline!r} is not allowed with server=async: a deadline "
                             "closes synchronous rounds; leave clock.deadline null")
        if settings.clients_per_round is not None:
            raise ValueError(f"clients_per_round={settings.clients_per_round} is not allowed with server=async: the "
                             "server keeps server.concurrency clients in flight; leave clients_per_round null")
        sampleable = settings.num_clients - len(settings.held_out_ids)
        if self.concurrency > sampleable:
            held = len(settings.held_out_ids)  # the limit may come from the held-out clients: name them then
            limit = (f"num_clients={settings.num_clients} less the {held} eval.held_out_clients={settings.held_out} "
                     "holds out" if held else f"num_clients={settings.num_clients}")
            raise ValueError(f"server.concurrency={self.concurrency} is not allowed with {limit}: at most the "
                             f"{sampleable} clients that can train may be in flight at once")
        if parts.channel.stages:
            raise ValueError(f"channel={parts.channel.shown} is not allowed with server=async: the upload channel "
                             "acts on synchronous rounds' updates; use channel=none")
        system = type(parts.system)
        if system.reporting is not System.reporting or system.budgets is not System.budgets:  # asked per round
            shown = f"system={parts.choices['system']}" if parts.choices.get("system") else f"system {system.__name__}"
            raise ValueError(f"{shown} is not allowed with server=async: "
                             "on the asynchronous server the clock makes clients slow, and none drops out; use "
                             "system=none or availability")

    def per_step(self, settings: Settings) -> tuple[int, str]:
        """The most clients one dispatch sends: all in flight, at the start or when all arrive at one instant."""
        return self.concurrency, "server.concurrency"

    def drive(self, loop: RoundLoop) -> dict:
        from fedagg.loop.asynchronous import run_async

        return run_async(loop, self.concurrency)
