"""Kill -9 fault injection: writers are SIGKILLed at random moments and nothing is lost.

What it does
------------
Writer processes flush and append into their own sessions of one log (several
writers share the log; each session has one writer at a time, like one agent per
conversation).  After every call that returned, a writer reports an
*acknowledgement* to this parent through a pipe: the session, the position where
the written messages start, their ids, the resulting head and length.  Before an
``append`` with ``expected_head`` it also reports its *intent*, so that a writer
killed mid-append is restarted with the same call to retry (the retry must be
recognised, not written twice).  Writers also rewind (a flush of a shorter list
plus a new message) so tombstones are crashed too.  When the ``projections``
package is importable, a projector process catches a SQLite projection up in a
loop and is killed as well.

The parent SIGKILLs a random writer (or the projector) after a random delay,
counted for most kills from the victim's first report (it has opened the log) and
for the rest from its start (it may still be importing or opening), then
drains the acknowledgements the dead process sent, and restarts it; a restarted
writer reads its sessions back from the log (``messages()``) and goes on, as a
resumed agent would.  After the kills every writer runs a last short, clean round
so that the final state is acknowledged, then the parent checks:

- ``verify()`` is ok (hash chain, digests, derived indexes);
- every acknowledged message is in the session's history at its acknowledged
  position, written by one event, and the acknowledged head is the node there;
- each session's live transcript equals the acknowledged model (positions
  written by a call that committed but died before acknowledging must hold that
  session's messages) and its head is the last acknowledged head;
- no message id was appended twice anywhere, and no live transcript repeats one;
- the projection caught up after the crashes equals a rebuild from scratch.

Run it
------
    python scripts/crash_harness.py --kills 1000 --durability full
    python scripts/crash_harness.py --kills 1000 --durability all --json results.json

    python scripts/crash_harness.py --attacks 1 --seed 1

``--attacks ROUNDS`` runs the attacks beyond kills instead (:data:`ATTACKS`): every page of
a log zeroed and filled with noise (verify must report, in a child, never abort; salvage
must give a log that verifies), opening on a full tmpfs (``StorageFullError``, never SIGBUS),
spilled rewinds, edits, compactions and clears recovered, forked children closing an
inherited log under the parent's open snapshot, and links planted where a log creates its
files.

Exit status 0 when every check passed.  The tests run :func:`run` with a few
dozen kills, and :func:`run_attacks` once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

# Run from a checkout: import the packages next to this script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("full", "process", "none")
REWIND_ABOVE = 120
"""Sessions longer than this are rewound, so flushes stay cheap on long runs."""
AT_START = 0.2
"""The share of kills whose delay counts from the victim's start, so they can land while it
imports and opens the log; the others count from its first report, so that however slowly a
machine starts Python, most kills land while the victim is writing."""


# -- messages -------------------------------------------------------------------


def message_for(uid: str) -> dict[str, Any]:
    """The message with id ``uid``: deterministic, so a restarted writer can rebuild a retry."""
    h = sha256(uid.encode()).digest()
    size = h[0] * 3  # 0 .. 765 bytes of filler: realistic message sizes
    role = "user" if h[1] & 1 else "assistant"
    return {"role": role, "content": f"{uid} " + "lorem ipsum "[h[2] % 6 :] * (size // 12), "uid": uid}


# -- the writer process ---------------------------------------------------------


def _send(line: dict[str, Any]) -> None:
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    # One write(2); a line cut short by SIGKILL has no newline and the parent drops it.
    os.write(1, data)


def writer_main(cfg: dict[str, Any]) -> int:
    from eventlog import EMPTY_HEAD, EventLog

    rng = random.Random(cfg["seed"])
    sessions: list[str] = cfg["sessions"]
    gen = cfg["incarnation"]
    counter = 0

    def new_uid(session: str) -> str:
        nonlocal counter
        counter += 1
        return f"{session}|{gen}|{counter}"

    with EventLog.open(cfg["path"], durability=cfg["durability"]) as log:
        lists: dict[str, list[dict[str, Any]]] = {}
        heads: dict[str, str | None] = {}
        for s in sessions:
            lists[s] = log.messages(s) if s in log else []
            heads[s] = log.head(s)
            # What this writer resumes from: the parent checks it against what was acknowledged.
            _send({"t": "hello", "s": s, "u": [m["uid"] for m in lists[s]], "h": heads[s]})
        # A writer killed between its intent and its acknowledgement retries the same
        # append: whether or not it landed, it must be written exactly once.
        for intent in cfg.get("intents", []):
            s, uids = intent["s"], intent["u"]
            result = log.append(s, [message_for(u) for u in uids], expected_head=intent["h"])
            lists[s] = log.messages(s)
            heads[s] = result.head
            _send({"t": "ack", "s": s, "p": intent["p"], "u": uids, "h": result.head, "n": len(lists[s]), "retry": 1})
        ops = cfg.get("ops", 0)
        done = 0
        while not ops or done < ops:
            done += 1
            s = rng.choice(sessions)
            current = lists[s]
            roll = rng.random()
            if current and (roll < 0.08 or len(current) > REWIND_ABOVE):
                # Rewind or edit: keep a prefix, add one new message.
                keep = rng.randint(1, len(current))
                uids = [new_uid(s)]
                wanted = current[:keep] + [message_for(uids[0])]
                result = log.flush(s, wanted)
                position = keep
            elif roll < 0.18:
                # Several exit paths flush the same list: nothing may be written.
                result = log.flush(s, current)
                if result.appended or result.tombstoned or result.head != heads[s]:
                    raise AssertionError(f"a repeated flush of {s} wrote something: {result}")
                continue
            elif roll < 0.40:
                uids = [new_uid(s) for _ in range(rng.randint(1, 3))]
                expected = heads[s] or EMPTY_HEAD
                _send({"t": "intent", "s": s, "p": len(current), "u": uids, "h": expected})
                wanted = current + [message_for(u) for u in uids]
                result = log.append(s, wanted[len(current) :], expected_head=expected)
                position = len(current)
            else:
                uids = [new_uid(s) for _ in range(rng.randint(1, 3))]
                wanted = current + [message_for(u) for u in uids]
                result = log.flush(s, wanted)
                position = len(current)
            lists[s] = wanted
            heads[s] = result.head
            relay = log.info()
            # "r": flushes another process committed for this one, "c": other processes' flushes it committed.
            _send(
                {
                    "t": "ack",
                    "s": s,
                    "p": position,
                    "u": uids,
                    "h": result.head,
                    "n": len(wanted),
                    "r": relay["relayed"],
                    "c": relay["carried"],
                }
            )
            if cfg.get("pause"):
                time.sleep(cfg["pause"])
    return 0


def projector_main(cfg: dict[str, Any]) -> int:
    from eventlog import EventLog
    from projections import SQLiteProjection

    # Open the log only once it exists: the projector must not create it.
    while not os.path.exists(os.path.join(cfg["path"], "data.mdb")):
        time.sleep(0.01)
    with EventLog.open(cfg["path"], durability=cfg["durability"]) as log:
        projection = SQLiteProjection(cfg["db"])
        try:
            while True:
                applied = projection.catch_up(log)
                _send({"t": "caught", "n": applied})
                time.sleep(0.005)
        finally:
            projection.close()


# -- the parent -----------------------------------------------------------------


@dataclass
class Result:
    durability: str
    kills: int = 0
    writer_kills: int = 0
    mid_write_kills: int = 0  # writer kills that came after the victim had acknowledged a write
    relayed_acks: int = 0  # acknowledged flushes another writer process committed (eventlog/relay.py)
    carrier_kills: int = 0  # writer kills of a process that was committing other processes' flushes
    projector_kills: int = 0
    incarnations: int = 0
    acks: int = 0
    retries: int = 0
    unacknowledged_commits: int = 0
    messages_acked: int = 0
    messages_checked: int = 0
    sessions: int = 0
    events: int = 0
    projection: str = "not available"
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Proc:
    """One incarnation of a writer or the projector, with a thread draining its pipe."""

    def __init__(self, argv: list[str], stderr_path: Path, gen: int = 0) -> None:
        self.gen = gen
        self.stderr = open(stderr_path, "ab")
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL)
        self.lines: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            if raw.endswith(b"\n"):
                self.lines.append(json.loads(raw))

    def wait_started(self, timeout: float = 30.0) -> None:
        """Until the process has sent its first line (a writer once it has opened the log, the
        projector once it has caught up), has exited, or ``timeout`` has passed."""
        deadline = time.monotonic() + timeout
        while not self.lines and self.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)

    def kill(self) -> None:
        try:
            self.popen.send_signal(signal.SIGKILL)
        except ProcessLookupError:  # pragma: no cover - already gone
            pass
        self.finish()

    def finish(self, timeout: float | None = None) -> int:
        code = self.popen.wait(timeout=timeout)
        self.thread.join()
        assert self.popen.stdout is not None
        self.popen.stdout.close()
        self.stderr.close()
        return code


def _last_error(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _projection_available() -> bool:
    try:
        from projections import SQLiteProjection  # noqa: F401
    except ImportError:
        return False
    return True


def _tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every ordinary table's rows, sorted (virtual tables and their shadow tables excluded)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        virtual = [name for name, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL")]
        out = {}
        for name, _ in rows:
            if name.startswith("sqlite_") or any(name == v or name.startswith(v + "_") for v in virtual):
                continue
            out[name] = sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
    conn.close()
    return out


def run(
    workdir: str | os.PathLike[str],
    *,
    durability: str = "full",
    kills: int = 30,
    writers: int = 3,
    sessions_per_writer: int = 3,
    seed: int = 0,
    max_delay: float = 0.12,
    projection: bool | None = None,
    progress: bool = False,
    carriers: float = 0.0,
) -> Result:
    """Run the harness in ``workdir`` (the log and projection are created there) and check the log.

    ``carriers``: the share of kills aimed at the writer that last said it committed other
    writers' flushes (the relay's carrier), when there is one."""
    started = time.monotonic()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "log"
    db = workdir / "projection.db"
    rng = random.Random(seed)
    result = Result(durability)
    if projection is None:
        projection = _projection_available()
    script = os.path.abspath(__file__)
    sessions = {w: [f"w{w}s{j}" for j in range(sessions_per_writer)] for w in range(writers)}
    pending: dict[int, dict[str, dict[str, Any]]] = {w: {} for w in range(writers)}
    model: dict[str, list[str]] = defaultdict(list)
    # Per writer and session: the oldest incarnation whose last call may be unacknowledged.
    # (Per session: a writer killed while saying hello has reconciled only some sessions.)
    since: dict[tuple[int, str], int] = {}
    acked: list[dict[str, Any]] = []
    last_head: dict[str, str | None] = {}
    incarnation = 0

    def start_writer(w: int, ops: int = 0) -> _Proc:
        nonlocal incarnation
        incarnation += 1
        result.incarnations += 1
        cfg = {
            "path": str(path),
            "durability": durability,
            "sessions": sessions[w],
            "seed": rng.getrandbits(32),
            "incarnation": incarnation,
            "intents": list(pending[w].values()),
            "ops": ops,
        }
        return _Proc([sys.executable, script, "--writer", json.dumps(cfg)], workdir / f"writer{w}.err", incarnation)

    def start_projector() -> _Proc:
        cfg = {"path": str(path), "durability": durability, "db": str(db)}
        return _Proc([sys.executable, script, "--projector", json.dumps(cfg)], workdir / "projector.err")

    def reconcile(w: int, line: dict[str, Any]) -> None:
        s, found = line["s"], line["u"]
        want = model[s]
        if found != want:
            # Only the last call of a killed writer can have committed without an
            # acknowledgement: an extension by its new messages, or a rewind to a
            # prefix plus one new message.  Anything else lost acknowledged messages.
            retried = {u for intent in pending[w].values() for u in intent["u"]}  # may be older

            def fresh(uids: list[str]) -> bool:
                return all(
                    u.startswith(s + "|")
                    and (int(u.split("|")[1]) >= since.get((w, s), 0) or u in retried)
                    and u not in want
                    for u in uids
                )

            extended = len(found) > len(want) and found[: len(want)] == want and fresh(found[len(want) :])
            keep = len(found) - 1
            rewound = 1 <= keep <= len(want) and found[:keep] == want[:keep] and fresh(found[keep:])
            if not (extended or rewound):
                result.problems.append(
                    f"{s}: a restarted writer found {len(found)} messages ending {found[-3:]}, "
                    f"but {len(want)} ending {want[-3:]} were acknowledged"
                )
            result.unacknowledged_commits += 1
        model[s] = list(found)
        last_head[s] = line["h"]

    def absorb(w: int, proc: _Proc) -> None:
        result.relayed_acks += max((line.get("r", 0) for line in proc.lines), default=0)
        for line in proc.lines:
            s = line.get("s")
            if line["t"] == "hello":
                reconcile(w, line)
            elif line["t"] == "intent":
                pending[w][s] = line
            elif line["t"] == "ack":
                pending[w].pop(s, None)
                p, uids = line["p"], line["u"]
                if p > len(model[s]):
                    result.problems.append(
                        f"{s}: acknowledged a write at position {p} after only {len(model[s])} messages"
                    )
                chain = model[s][:p] + uids
                model[s] = chain
                if line["n"] != len(chain):
                    result.problems.append(f"{s}: acknowledged length {line['n']} but the model has {len(chain)}")
                last_head[s] = line["h"]
                acked.append(line)
                result.acks += 1
                result.retries += line.get("retry", 0)
                result.messages_acked += len(uids)
        for line in proc.lines:
            if line["t"] == "hello":
                since[(w, line["s"])] = proc.gen  # everything older is reconciled for this session

    procs: dict[int, _Proc] = {w: start_writer(w) for w in range(writers)}
    projector = start_projector() if projection else None
    for i in range(kills):
        victim = rng.randrange(writers + (1 if projector else 0))
        if carriers and rng.random() < carriers:
            carrying = [w for w, proc in procs.items() if any(line.get("c") for line in list(proc.lines)[-5:])]
            if carrying:
                victim = rng.choice(carrying)
        target = projector if victim == writers else procs[victim]
        assert target is not None
        if rng.random() >= AT_START:
            target.wait_started()
        time.sleep(rng.uniform(0, max_delay))
        if victim == writers:
            assert projector is not None
            projector.kill()
            code = projector.popen.returncode
            if code != -signal.SIGKILL:
                result.problems.append(
                    f"projector exited with {code} before it was killed: {_last_error(workdir / 'projector.err')}"
                )
            result.projector_kills += 1
            projector = start_projector()
        else:
            proc = procs[victim]
            proc.kill()
            absorb(victim, proc)
            result.mid_write_kills += any(line["t"] == "ack" for line in proc.lines)
            result.carrier_kills += any(line.get("c") for line in proc.lines)
            code = proc.popen.returncode
            if code != -signal.SIGKILL:
                # Keep going (a writer that failed is restarted like a killed one) so one
                # run reports every failure; the run still fails.
                result.problems.append(
                    f"writer {victim} exited with {code} before it was killed: {_last_error(workdir / f'writer{victim}.err')}"
                )
            result.writer_kills += 1
            procs[victim] = start_writer(victim)
        result.kills += 1
        if progress and (i + 1) % 100 == 0:
            print(
                f"  {durability}: {i + 1} kills, {result.messages_acked} messages acknowledged",
                file=sys.stderr,
                flush=True,
            )

    # Stop everything, then let each writer finish a short clean round so the final
    # state of every session is acknowledged.
    for w, proc in procs.items():
        proc.kill()
        absorb(w, proc)
    if projector is not None:
        projector.kill()
    settled = True
    for w in range(writers):
        proc = start_writer(w, ops=4 * sessions_per_writer)
        try:
            code = proc.finish(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        absorb(w, proc)
        if code != 0:
            result.problems.append(
                f"writer {w} final round exited with {code}: {_last_error(workdir / f'writer{w}.err')}"
            )
            settled = False
    if not settled:  # the final state is not known: nothing to check against
        result.seconds = time.monotonic() - started
        return result

    _check(path, durability, sessions, model, acked, last_head, result)
    if projection:
        _check_projection(path, durability, db, workdir / "rebuilt.db", result)
    result.seconds = time.monotonic() - started
    return result


def _check(
    path: Path,
    durability: str,
    sessions: dict[int, list[str]],
    model: dict[str, list[str]],
    acked: list[dict[str, Any]],
    last_head: dict[str, str | None],
    result: Result,
) -> None:
    from eventlog import EventLog

    problems = result.problems
    with EventLog.open(path, durability=durability) as log:
        report = log.verify()
        if not report.ok:
            problems.append(f"verify: {report}")
        result.events = log.last_seq
        appended_where: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        occurrences: dict[str, dict[tuple[int, str], Any]] = {}
        for s in [s for group in sessions.values() for s in group]:
            if s not in log:
                if model.get(s):
                    problems.append(f"{s}: {len(model[s])} messages were acknowledged but the session is missing")
                continue
            result.sessions += 1
            history = log.history(s)
            index = {}
            for occ in history:
                uid = occ.message.get("uid")
                index[(occ.position, uid)] = occ
                if occ.origin == "append":
                    appended_where[uid].append((s, occ.position, occ.seq))
                if not isinstance(uid, str) or not uid.startswith(s + "|"):
                    problems.append(f"{s}: history holds a message that this session never wrote: {occ.message!r:.100}")
            occurrences[s] = index
            live = [m.get("uid") for m in log.messages(s)]
            want = model[s]
            if live != want:
                first = next((i for i, (w, got) in enumerate(zip(want, live)) if w != got), min(len(live), len(want)))
                problems.append(
                    f"{s}: live transcript differs from the acknowledged one at position {first} "
                    f"(live {len(live)}, acknowledged {len(want)}; live has {live[first : first + 3]}, "
                    f"acknowledged {want[first : first + 3]}; history there: "
                    f"{[(o.position, o.message.get('uid'), o.seq, o.origin, o.tombstone) for o in history if o.position == first]})"
                )
            if len(set(live)) != len(live):
                problems.append(f"{s}: a message appears twice in the live transcript")
            if log.head(s) != last_head.get(s):
                problems.append(f"{s}: head {log.head(s)} is not the last acknowledged head {last_head.get(s)}")
            result.messages_checked += len(live)
    for uid, places in appended_where.items():
        if len(places) != 1:
            problems.append(f"message {uid} was written {len(places)} times: {places}")
    for ack in acked:
        s, p, uids = ack["s"], ack["p"], ack["u"]
        seqs = set()
        for offset, uid in enumerate(uids):
            occ = occurrences.get(s, {}).get((p + offset, uid))
            if occ is None:
                problems.append(f"{s}: acknowledged message {uid} is not in the history at position {p + offset}")
                break
            seqs.add(occ.seq)
        else:
            last = occurrences[s][(p + len(uids) - 1, uids[-1])]
            if ack["h"] is not None and last.node != ack["h"]:
                problems.append(f"{s}: acknowledged head {ack['h']} is not the node of {uids[-1]}")
            if len(seqs) != 1:
                problems.append(f"{s}: one acknowledged call was split over events {sorted(seqs)}")
        if len(problems) > 50:
            break


def _check_projection(path: Path, durability: str, db: Path, rebuilt: Path, result: Result) -> None:
    from eventlog import EventLog
    from projections import SQLiteProjection

    with EventLog.open(path, durability=durability) as log:
        incremental = SQLiteProjection(db)
        fresh = SQLiteProjection(rebuilt)
        try:
            incremental.catch_up(log)
            fresh.rebuild(log)
        finally:
            incremental.close()
            fresh.close()
    a, b = _tables(db), _tables(rebuilt)
    if a != b:
        differing = sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))
        result.problems.append(f"projection caught up after crashes differs from a rebuild in tables {differing}")
        result.projection = "differs from rebuild"
    else:
        result.projection = f"equals rebuild ({sum(len(rows) for rows in a.values())} rows)"


# -- command line ---------------------------------------------------------------


# -- attacks beyond kills --------------------------------------------------------

_ATTACK_CHILD = r"""
import json, os, sys
from eventlog import EventLog, EventLogError
from eventlog.verify import verify_files
path, task = sys.argv[1], sys.argv[2]
if task == "verify":
    try:
        log = EventLog.open(path, readonly=True)
    except EventLogError as e:
        report = verify_files(path, e)
    else:
        with log:
            report = log.verify()
    print(json.dumps({"ok": report.ok, "damaged": [str(d) for d in report.damaged_pages]}))
elif task == "open-full":
    try:
        with EventLog.open(path) as log:
            log.flush("s", [{"role": "user", "content": "on a full disk"}])
        print(json.dumps({"error": None}))
    except EventLogError as e:
        print(json.dumps({"error": type(e).__name__}))
"""


@dataclass
class Attack:
    """One kind of attack run ``trials`` times; ``failures`` says what went wrong, if anything."""

    name: str
    trials: int = 0
    detail: str = ""
    failures: list[str] = field(default_factory=list)


def _child(path: Path, task: str) -> tuple[int, dict[str, Any] | None]:
    done = subprocess.run(
        [sys.executable, "-c", _ATTACK_CHILD, str(path), task], capture_output=True, text=True, timeout=300
    )
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else None


def _attack_log(path: Path, rng: random.Random) -> None:
    from eventlog import EventLog

    with EventLog.open(path, durability="none") as log:
        for s in range(4):
            current: list[dict[str, Any]] = []
            for i in range(rng.randint(20, 40)):
                current.append(message_for(f"attack{s}|{i}"))
                log.flush(f"a{s}", current)
            log.flush(f"a{s}", current[: rng.randint(1, len(current))])
        log.flush("big", [{"role": "tool", "content": "y" * 20_000}])


def attack_page_damage(base: Path, rng: random.Random, rounds: int) -> Attack:
    """Every page of a log zeroed or filled with noise in turn: verify returns a report in a child
    (never an abort), and salvage copies only proven events into a new log that verifies."""
    from eventlog.salvage import salvage

    attack = Attack("page damage sweep (zeroed / random pages)")
    source = base / "pages"
    _attack_log(source, rng)
    pages = (source / "data.mdb").stat().st_size // 4096
    damaged = salvaged = 0
    for fill in ("zero", "random")[: max(1, min(2, rounds))]:
        for page in range(2, pages):
            scratch = base / "pages-scratch"
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.copytree(source, scratch)
            with open(scratch / "data.mdb", "r+b") as f:
                f.seek(page * 4096)
                f.write(bytes(4096) if fill == "zero" else rng.randbytes(4096))
            attack.trials += 1
            code, report = _child(scratch, "verify")
            if code != 0 or report is None:
                attack.failures.append(f"{fill} page {page}: verify died with {code}")
                continue
            if report["ok"]:
                continue  # a free page: nothing reads it
            damaged += 1
            new = base / "pages-salvaged"
            shutil.rmtree(new, ignore_errors=True)
            try:
                outcome = salvage(scratch, new)
            except Exception as e:  # the harness reports every failure
                attack.failures.append(f"{fill} page {page}: salvage raised {type(e).__name__}: {e}")
                continue
            if not outcome.verified:
                attack.failures.append(f"{fill} page {page}: the salvaged log does not verify")
            salvaged += outcome.events_copied
    attack.detail = (
        f"{pages - 2} pages x {attack.trials // max(1, pages - 2)} fills; {damaged} reported damaged, each salvaged"
    )
    return attack


def attack_full_disk(base: Path, rng: random.Random, rounds: int) -> Attack:
    """Open a new log, and one whose lock file is missing, on a full tmpfs: StorageFullError, not SIGBUS."""
    attack = Attack("open on a full tmpfs (new log / lock file missing)")
    for _ in range(rounds):
        for case in ("new", "lock missing"):
            mount = base / f"tmpfs-{rng.randrange(1 << 30)}"
            mount.mkdir()
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
            if done.returncode != 0:
                attack.detail = "not run: mounting a tmpfs needs root"
                return attack
            try:
                if case == "lock missing":
                    from eventlog import EventLog

                    with EventLog.open(mount / "log") as log:
                        log.flush("s", [{"role": "user", "content": "stored"}])
                    (mount / "log" / "lock.mdb").unlink()
                fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
                for size in (65536, 4096, 1):
                    try:
                        while True:
                            os.write(fd, b"\xff" * size)
                    except OSError:
                        pass
                os.close(fd)
                attack.trials += 1
                code, outcome = _child(mount / "log", "open-full")
                if code != 0 or outcome is None or outcome["error"] != "StorageFullError":
                    attack.failures.append(f"{case}: exit {code}, {outcome}")
            finally:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    attack.detail = f"{attack.trials} opens"
    return attack


def attack_spilled_rewrites(base: Path, rng: random.Random, rounds: int) -> Attack:
    """Rewinds, edits, compactions and clears spilled by a log that refuses writes, then recovered:
    the log ends as the refused flush would have left it, and the spill files are gone."""
    from eventlog import EventLog
    from eventlog.spill import SpillingWriter, recover

    attack = Attack("spilled rewind / edit / compaction / clear, recovered")
    for trial in range(rounds * 4):
        path, spill = base / f"spill-log-{trial}", base / f"spill-{trial}"
        stored = [message_for(f"spill{trial}|{i}") for i in range(rng.randint(3, 12))]
        kind = ("rewind", "edit", "compaction", "clear")[trial % 4]
        if kind == "rewind":
            wanted, replace = stored[: rng.randint(1, len(stored) - 1)], False
        elif kind == "edit":
            wanted, replace = [*stored[:-1], message_for(f"spill{trial}|edited")], False
        elif kind == "compaction":
            wanted = [{"role": "user", "content": "summary", "_compressed_summary": True}, *stored[-2:]]
            replace = False
        else:
            wanted, replace = [], True
        with EventLog.open(path) as log:
            log.flush("s", stored)
        with EventLog.open(path, readonly=True) as log:
            SpillingWriter(log, spill).flush("s", wanted, replace=replace)
        with EventLog.open(path) as log:
            report = recover(log, spill)
            expected = [{k: v for k, v in m.items() if not k.startswith("_")} for m in wanted]
            reasons = {o.tombstone.reason for o in log.history("s") if o.tombstone}
            attack.trials += 1
            if not report.ok or log.messages("s") != expected or reasons != {kind} or list(spill.iterdir()):
                attack.failures.append(f"{kind}: recovered {log.messages('s')[:2]}..., reasons {reasons}, {report}")
    attack.detail = f"{attack.trials} spills"
    return attack


_FORK_CHILD = r"""
import json, os, sys
from eventlog import EventLog
log = EventLog.open(sys.argv[1])
log.flush("s", [{"role": "user", "content": "before the forks"}])
store = log._store
with store.read() as txn:
    before = store.env.readers()
    for _ in range(int(sys.argv[2])):
        pid = os.fork()
        if pid == 0:
            log.close()
            sys.exit(0)
        os.waitpid(pid, 0)
    same = store.env.readers() == before
    for i in range(100):
        log.flush("s", [{"role": "user", "content": "before the forks"}] + [{"role": "user", "content": str(j)} for j in range(i)])
    count = sum(1 for _ in txn.cursor(db=store.events))
print(json.dumps({"same": same, "count": count}))
"""


def attack_forked_children(base: Path, rng: random.Random, rounds: int) -> Attack:
    """Children forked with the log open close it and exit: the parent's open snapshot keeps its pages."""
    attack = Attack("forked children closing an inherited log")
    children = 10 * rounds
    done = subprocess.run(
        [sys.executable, "-c", _FORK_CHILD, str(base / "fork-log"), str(children)], capture_output=True, text=True
    )
    attack.trials = children
    lines = done.stdout.strip().splitlines()
    outcome = json.loads(lines[-1]) if lines else None
    if done.returncode != 0 or outcome is None or not outcome["same"] or outcome["count"] != 2:
        attack.failures.append(f"exit {done.returncode}: {outcome} {done.stderr[-300:]}")
    attack.detail = f"{children} children"
    return attack


def attack_planted_links(base: Path, rng: random.Random, rounds: int) -> Attack:
    """Symlinks and hard links planted where a log creates its files, in a directory others can
    write: refused (or replaced, never followed); the files they point to are never written."""
    from eventlog import EventLog, EventLogError

    attack = Attack("planted symlinks and hard links")
    for trial in range(rounds):
        for name in ("lock.mdb", "data.mdb", "eventlog.id", "hardlink"):
            victim = base / f"victim-{trial}-{name}"
            victim.write_bytes(b"precious\n")
            folder = base / f"shared-{trial}-{name}"
            folder.mkdir()
            os.chmod(folder, 0o777)
            if name == "hardlink":
                os.link(victim, folder / "lock.mdb")
            else:
                (folder / name).symlink_to(victim)
            for pid in range(os.getpid() - 20, os.getpid() + 20):
                (folder / f"eventlog.id.{pid}.tmp").symlink_to(victim)
            attack.trials += 1
            for shared in (False, True):
                try:
                    with EventLog.open(folder, allow_shared_directory=shared) as log:
                        log.flush("s", [{"role": "user", "content": "x"}])
                except EventLogError:
                    pass
            if victim.read_bytes() != b"precious\n":
                attack.failures.append(f"{name}: the planted link's target was written")
    attack.detail = f"{attack.trials} planted directories"
    return attack


ATTACKS = (attack_page_damage, attack_full_disk, attack_spilled_rewrites, attack_forked_children, attack_planted_links)


def run_attacks(base: Path, *, seed: int, rounds: int = 1, only: tuple[str, ...] = ()) -> list[Attack]:
    """Run every attack of :data:`ATTACKS` (or those named in ``only``) under ``base``; each
    says what failed, if anything."""
    rng = random.Random(seed)
    out = []
    for attack in ATTACKS:
        if only and attack.__name__ not in only:
            continue
        folder = base / attack.__name__
        folder.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        result = attack(folder, rng, rounds)
        result.detail += f" ({time.monotonic() - started:.0f} s)"
        out.append(result)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs to deliver (default 1000)")
    parser.add_argument("--durability", default="full", choices=[*MODES, "all"])
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=3, help="sessions per writer")
    parser.add_argument("--max-delay", type=float, default=0.12, help="longest wait between kills, seconds")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--carriers", type=float, default=0.0, help="share of kills aimed at the writer committing others' flushes"
    )
    parser.add_argument("--no-projection", action="store_true")
    parser.add_argument("--workdir", help="keep the logs here (default: a temporary directory, removed on success)")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument(
        "--attacks",
        type=int,
        metavar="ROUNDS",
        help="instead of kills, run the other attacks (page damage, full tmpfs, spills, forks, planted links)",
    )
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    parser.add_argument("--projector", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        return writer_main(json.loads(args.writer))
    if args.projector:
        return projector_main(json.loads(args.projector))

    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    modes = MODES if args.durability == "all" else (args.durability,)
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="crash-harness-"))
    if args.attacks:
        found = run_attacks(base, seed=seed, rounds=args.attacks)
        print(f"{'attack':55} {'trials':>6}  result")
        for attack in found:
            verdict = "OK" if not attack.failures else "FAILED: " + "; ".join(attack.failures[:3])
            print(f"{attack.name:55} {attack.trials:6}  {verdict}  [{attack.detail}]")
        if args.json:
            Path(args.json).write_text(
                json.dumps({"seed": seed, "attacks": [asdict(a) for a in found]}, indent=2) + "\n"
            )
        failed = any(attack.failures for attack in found)
        if not failed and not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
        return 1 if failed else 0
    results = []
    for mode in modes:
        print(
            f"{mode}: {args.kills} kills, {args.writers} writers x {args.sessions} sessions, seed {seed}",
            file=sys.stderr,
            flush=True,
        )
        outcome = run(
            base / mode,
            durability=mode,
            kills=args.kills,
            writers=args.writers,
            sessions_per_writer=args.sessions,
            seed=seed,
            max_delay=args.max_delay,
            projection=False if args.no_projection else None,
            progress=True,
            carriers=args.carriers,
        )
        results.append(outcome)
    print(
        f"{'mode':8} {'kills':>6} {'writer':>7} {'mid-w':>6} {'proj.':>6} {'acks':>7} {'retries':>7} {'msgs acked':>10} {'live checked':>12} {'events':>8} {'secs':>7}  result"
    )
    for r in results:
        verdict = "OK" if r.ok else "FAILED: " + "; ".join(r.problems[:5])
        print(
            f"{r.durability:8} {r.kills:6} {r.writer_kills:7} {r.mid_write_kills:6} {r.projector_kills:6} {r.acks:7} {r.retries:7} {r.messages_acked:10} {r.messages_checked:12} {r.events:8} {r.seconds:7.1f}  {verdict}"
        )
        print(f"{'':8} projection: {r.projection}")
        print(
            f"{'':8} relay: {r.relayed_acks} acknowledged flushes committed by another writer, {r.carrier_kills} kills of a writer committing others' flushes"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "seed": seed,
                    "python": sys.version.split()[0],
                    "results": [asdict(r) | {"ok": r.ok} for r in results],
                },
                indent=2,
            )
            + "\n"
        )
    ok = all(r.ok for r in results)
    if ok and not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    elif not ok:
        print(f"logs kept in {base}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
