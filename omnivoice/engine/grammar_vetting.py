"""Grammars checked before a request reaches the thinker, so that no schema costs the step loop more
than a bounded compile.

A grammar is first checked for what makes it too costly or unusable on its text alone
(`schema_limits`); then compiled by llguidance with the served tokenizer, and its first token mask
computed (where llguidance builds its lexer: the costly part), in a worker process of its own, under
a time limit (the process is killed past it) and a memory limit (its address space). Answers are
cached by grammar, and a grammar being checked is checked once however many requests bring it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import resource
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from omnivoice.models.grammars import grammar_error, grammar_tokenizer, matcher_error, matcher_for
from omnivoice.models.schema_limits import schema_limit_error
from omnivoice.types import Grammar, Tools

log = logging.getLogger(__name__)
START_ALLOWANCE_S = 60.0  # a fresh worker's imports and llguidance tokenizer, on a loaded host
_worker_tokenizer: list[Any] = []  # the worker process's llguidance tokenizer (set by _start_worker)


class GrammarVetter:
    """Says why a grammar cannot constrain the thinker (None when it can); thread-safe."""

    def __init__(
        self, hf_tokenizer: Any | None, end_ids: tuple[int, ...], timeout_s: float, memory_mb: int, cache: int
    ) -> None:
        """`hf_tokenizer`: the served model's (None: grammars are compiled without a vocabulary);
        `timeout_s`, `memory_mb`: one compile's limits; `cache`: answers kept."""
        self._tokenizer, self._end_ids = hf_tokenizer, end_ids
        self._timeout_s, self._memory = timeout_s, memory_mb * 1024 * 1024
        self._size = cache
        self._answers: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._pending: dict[tuple[str, str], Future[str | None]] = {}
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._compiling = threading.Lock()
        self._cold = True  # the next compile starts the worker (its imports and tokenizer first)
        self._closed = False

    def check(self, grammar: Grammar) -> str | None:
        """Why `grammar` cannot be used (a message for the client), or None. Blocks (call it off the
        event loop) for at most about the time limit, plus the worker's start the first time."""
        key = (grammar.kind, grammar.source)
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
        if not owner:
            return pending.result()
        try:
            answer = self._vet(grammar)
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._lock:
                self._pending.pop(key, None)
        with self._lock:
            self._answers[key] = answer
            while len(self._answers) > self._size:
                self._answers.popitem(last=False)
        pending.set_result(answer)
        return answer

    def check_functions(self, tools: Tools, grammar: Grammar) -> str | None:
        """Why the call grammar of `tools` (`grammar`) cannot be used: a function's parameters schema
        over the limits on its text, or the grammar's compile (as `check`)."""
        for f in tools.functions:
            if tools.function is not None and f.name != tools.function:
                continue
            error = schema_limit_error(f.parameters) if f.parameters is not None else None
            if error is not None:
                return f"function {f.name!r}: {error}"
        return self.check(grammar)

    def _vet(self, grammar: Grammar) -> str | None:
        if grammar.kind == "json_schema":
            try:
                error = schema_limit_error(json.loads(grammar.source))
            except (ValueError, RecursionError):
                error = None  # compile_grammar says why it is not a schema
            if error is not None:
                return error
        if self._tokenizer is None:
            return grammar_error(grammar)
        try:
            with self._compiling:  # one compile at a time: the time limit counts its own run only
                future = self._worker().submit(_vet_in_worker, grammar)
                return future.result(timeout=self._timeout_s + self._started())
        except FutureTimeout:
            self._kill()
            return f"the grammar is too costly to compile (over {self._timeout_s:g} s)"
        except BrokenProcessPool:
            self._kill()
            return f"the grammar is too costly to compile (over {self._memory >> 20} MB)"

    def _started(self) -> float:
        """Extra seconds the next compile may take: a worker's start the first time after a kill."""
        cold, self._cold = self._cold, False
        return START_ALLOWANCE_S if cold else 0.0

    def _worker(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the grammar checker is closed")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(self._tokenizer, self._end_ids, self._memory),
                )
            return self._pool

    def _kill(self) -> None:
        """End the worker (a compile past its limits is not waited for); the next check starts one."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._cold = True
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):  # no public way to kill them
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._kill()


def _start_worker(hf_tokenizer: Any, end_ids: tuple[int, ...], memory: int) -> None:
    """In the worker: build llguidance's tokenizer, then cap the address space `memory` above what
    the process holds now (a compile past it fails, and ends the worker). The worker ends with the
    process that started it, however that one ends (SIGKILL included)."""
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), name="grammar-parent-watch", daemon=True).start()
    _worker_tokenizer.append(grammar_tokenizer(hf_tokenizer, len(hf_tokenizer), end_ids))
    with open("/proc/self/status") as f:
        size = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
    if size:
        resource.setrlimit(resource.RLIMIT_AS, (size + memory, size + memory))


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _vet_in_worker(grammar: Grammar) -> str | None:
    """In the worker: compile `grammar` and compute its first mask; why it fails, or None."""
    tokenizer = _worker_tokenizer[0]
    try:
        error = grammar_error(grammar, tokenizer)
        if error is not None:
            return error
        matcher = matcher_for(grammar, tokenizer)
        matcher.compute_bitmask()
    except ValueError as e:
        return str(e)
    except MemoryError:
        return "the grammar is too costly to compile (out of memory)"
    return matcher_error(matcher) if matcher.is_error() else None
