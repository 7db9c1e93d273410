"""The answer store: idempotent writes, resume and reset, the outbox, validation, and many writers at once."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import platformdirs
import pytest

from classroom.store import AnswerStore, Attempt, KeyConflict, content_version, current_learner, default_path, new_key

ROOT = Path(__file__).resolve().parents[1]


def make(learner="ada", entry_id="kv-cache", check_index=0, correct=True, attempt=1, time=1000.0, **kw):
    fields = dict(key=new_key(), learner=learner, entry_id=entry_id, check_index=check_index,
                  question="How many MiB?", params={"L": 12, "dtype_bytes": 2.0}, response="6", expected="6.0",
                  correct=correct, attempt=attempt, time=time, content_version="ab" * 32)
    fields.update(kw)
    return Attempt(**fields)


def test_add_is_idempotent_and_attempts_come_back_in_time_order(tmp_path):
    store = AnswerStore(tmp_path / "a.sqlite")
    late, early = make(time=2000.0), make(time=1000.0, learner="bo")
    assert store.add(late) is True and store.add(early) is True
    assert store.add(late) is False  # the same key again: not a second record
    assert store.attempts() == [early, late]
    assert store.attempts("ada") == [late] and store.attempts(entry_id="mla") == []
    assert store.count() == 2
    again = AnswerStore(tmp_path / "a.sqlite")  # another connection sees the committed rows
    assert again.attempts("ada")[0].params == {"L": 12, "dtype_bytes": 2.0}


def test_groups_in_one_transaction_are_each_all_or_none_and_numbered_in_order(tmp_path):
    store = AnswerStore(tmp_path / "a.sqlite")
    taken = make(learner="bo")
    store.add(taken)
    first, second, late = [make(attempt=9)], [make(attempt=9), make(key=taken.key)], [make(attempt=9)]
    result = store.add_groups([first, second, late], number=True)  # bo's key in ada's second group
    assert result[0] == [True] and isinstance(result[1], KeyConflict) and result[2] == [True]
    assert [a.attempt for a in store.attempts("ada")] == [1, 2]  # the refused group left no row and no number
    assert [a.key for a in store.attempts("ada")] == [first[0].key, late[0].key]


def test_reset_hides_attempts_from_resume_and_numbering_but_keeps_them(tmp_path):
    store = AnswerStore(tmp_path / "a.sqlite")
    store.add(make(check_index=2, attempt=1))
    store.add(make(check_index=2, attempt=2))
    store.add(make(entry_id="mla", check_index=2))
    assert store.next_attempt("ada", "kv-cache", 2) == 3
    assert store.reset("ada", "kv-cache") == 2
    assert store.attempts("ada", "kv-cache") == [] and store.next_attempt("ada", "kv-cache", 2) == 1
    assert len(store.attempts("ada", include_reset=True)) == 3 and store.count() == 3
    assert len(store.attempts("ada", "mla")) == 1  # other entries are untouched
    assert store.reset("ada", "kv-cache") == 0


def test_outbox_holds_attempts_until_delivered(tmp_path):
    store = AnswerStore(tmp_path / "a.sqlite")
    local, queued1, queued2 = make(), make(time=1.0), make(time=2.0)
    store.add(local)
    store.add(queued1, outbox=True)
    store.add(queued2, outbox=True)
    assert [a.key for a in store.pending()] == [queued1.key, queued2.key]
    store.mark_delivered([queued1.key, "not-a-stored-key"])
    assert store.pending() == [queued2]
    store.mark_delivered([queued2.key])
    assert store.pending() == [] and store.count() == 3


def test_json_round_trip_and_one_line_errors():
    a = make()
    assert Attempt.from_json(a.to_json()) == a
    bad = {"correct": 1, "attempt": 0, "check_index": -1, "key": "no spaces allowed", "time": float("nan"),
           "content_version": "abc", "params": {"L": "12"}, "learner": "", "response": 6}
    for name, value in bad.items():
        with pytest.raises(ValueError, match=rf"^attempt\.{name}: expected [^\n]+, got "):
            Attempt.from_json({**a.to_json(), name: value})
    with pytest.raises(ValueError, match="^attempt: missing field.s. time$"):
        Attempt.from_json({k: v for k, v in a.to_json().items() if k != "time"})
    with pytest.raises(ValueError, match="^attempt: unknown field.s. score$"):
        Attempt.from_json({**a.to_json(), "score": 1})
    with pytest.raises(ValueError, match="^attempt: expected a JSON object, got list$"):
        Attempt.from_json([])


def test_where_the_store_lives(tmp_path, monkeypatch):
    monkeypatch.setenv("DANTINOX_ANSWERS_DB", str(tmp_path / "deep" / "dir" / "x.sqlite"))
    assert AnswerStore().path == tmp_path / "deep" / "dir" / "x.sqlite" and AnswerStore().path.is_file()
    monkeypatch.delenv("DANTINOX_ANSWERS_DB")
    assert default_path() == platformdirs.user_data_path("dantinox-labs") / "answers.sqlite"
    monkeypatch.setenv("JUPYTERHUB_USER", "hub-ada")
    assert current_learner() == "hub-ada"
    entry = ROOT / "content" / "entries" / "kv-cache.yaml"
    assert len(content_version(entry)) == 64 and content_version(entry) == content_version(str(entry))


def test_unusable_paths_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="^answer store: expected a file path, got the directory "):
        AnswerStore(tmp_path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match=r"junk.sqlite: not a usable SQLite file \(file is not a database\)$"):
        AnswerStore(junk)


def test_store_uses_wal_so_readers_do_not_block_writers(tmp_path):
    AnswerStore(tmp_path / "a.sqlite")
    with sqlite3.connect(tmp_path / "a.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


WRITER = textwrap.dedent("""
    import sys, time
    from classroom.store import AnswerStore, Attempt
    store, who, n = AnswerStore(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(n):
        a = Attempt(key=f"{who}-{i}", learner=who, entry_id="kv-cache", check_index=i % 5, question="q",
                    params={}, response=str(i), expected="1", correct=i % 2 == 0, attempt=i + 1,
                    time=time.time(), content_version="cd" * 32)
        store.add(a, outbox=True)
        store.add(a)  # a retried delivery: must not count twice
        print(a.key, flush=True)  # printed only after the commit returned: an acknowledgement
""")


def test_several_processes_write_at_once_without_losing_or_doubling(tmp_path):
    db, writers, each = tmp_path / "shared.sqlite", 4, 150
    AnswerStore(db)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), f"w{w}", str(each)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(writers)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, [err[-500:] for _, err in outs]
    assert not any("locked" in err for _, err in outs)
    keys = [a.key for a in AnswerStore(db).attempts()]
    assert len(keys) == writers * each and len(set(keys)) == len(keys)
    assert set(keys) == {f"w{w}-{i}" for w in range(writers) for i in range(each)}
    assert len(AnswerStore(db).pending()) == writers * each


def test_a_writer_killed_mid_way_keeps_everything_it_acknowledged(tmp_path):
    db = tmp_path / "killed.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), "k", "1000000"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    acknowledged = [proc.stdout.readline().strip() for _ in range(200)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    stored = {a.key for a in AnswerStore(db).attempts()}
    assert proc.returncode == -signal.SIGKILL
    assert set(acknowledged) <= stored and len(stored) >= 200
    assert AnswerStore(db).add(make()) is True  # the file is still writable after the crash


def test_the_store_is_readable_by_its_owner_only(tmp_path):
    store = AnswerStore(tmp_path / "class" / "data" / "answers.sqlite")  # two directories it creates
    store.add(make())  # the -wal and -shm files exist once something is written
    for d in (tmp_path / "class", tmp_path / "class" / "data"):
        assert d.stat().st_mode & 0o777 == 0o700, d
    for name in ("answers.sqlite", "answers.sqlite-wal", "answers.sqlite-shm"):
        assert (store.path.parent / name).stat().st_mode & 0o777 == 0o600, name
    old = tmp_path / "old.sqlite"  # a file an earlier version left world-readable
    AnswerStore(old).close()
    os.chmod(old, 0o644)
    AnswerStore(old).close()
    assert old.stat().st_mode & 0o777 == 0o600


OUTSIDER = ("import sqlite3, sys\ndb = sqlite3.connect(sys.argv[1])\n"
            "print(db.execute('SELECT COUNT(*) FROM attempts').fetchone()[0])\ndb.close()")


def test_a_second_store_on_the_same_file_keeps_the_first_ones_locks(tmp_path):
    # Closing any descriptor of a file drops the process's POSIX locks on it: a second store that opened and
    # closed the file let the next outside connection take itself for the last one, checkpoint and delete the
    # WAL under the first store (its next read: "disk I/O error", its rows gone).
    path = tmp_path / "answers.sqlite"
    first = AnswerStore(path)
    for round_ in range(3):
        for _ in range(5):
            first.add(make())
        second = AnswerStore(path)  # a second quiz in the same kernel
        outside = subprocess.run([sys.executable, "-c", OUTSIDER, str(path)], capture_output=True, text=True,
                                 timeout=60)  # an export, another kernel: opens, counts, closes
        assert outside.returncode == 0 and int(outside.stdout) == 10 * round_ + 5, outside.stderr
        for _ in range(5):
            first.add(make())
        assert first.count() == second.count() == 10 * (round_ + 1)
        assert len(first.attempts()) == 10 * (round_ + 1)
        second.close()
    assert first.count() == 30  # the first store still works after the second let go of the file
    first.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT COUNT(*) FROM attempts").fetchone() == (30,)


def test_stores_on_one_file_share_one_set_of_connections(tmp_path):
    path = tmp_path / "answers.sqlite"
    a, b = AnswerStore(path), AnswerStore(str(path))
    assert a._db is b._db and a._rdb is b._rdb
    a.close()
    assert b.add(make()) and b.count() == 1  # the other store's connections stay open
    b.close()
    with pytest.raises(sqlite3.ProgrammingError):  # the last one closed them
        b._db.execute("SELECT 1")
    c = AnswerStore(path)
    assert c._db is not b._db and c.count() == 1


def test_numbers_past_floats_range_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^attempt\.time: expected unix seconds"):
        Attempt.from_json({**make().to_json(), "time": 10 ** 400})
    with pytest.raises(ValueError, match=r"^attempt\.params: expected an object of names to finite numbers"):
        Attempt.from_json({**make().to_json(), "params": {"T": -(10 ** 309)}})


OLD_SCHEMA = """CREATE TABLE attempts (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE,
    learner TEXT NOT NULL, entry_id TEXT NOT NULL, check_index INTEGER NOT NULL, question TEXT NOT NULL,
    params TEXT NOT NULL, response TEXT NOT NULL, expected TEXT NOT NULL, correct INTEGER NOT NULL,
    attempt INTEGER NOT NULL, time REAL NOT NULL, content_version TEXT NOT NULL, hidden INTEGER NOT NULL DEFAULT 0,
    delivered INTEGER)"""  # the first released schema: no refusal, no mistake


def test_a_file_from_before_exercise_checks_stays_readable_and_gains_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(OLD_SCHEMA)
    db.execute("INSERT INTO attempts (key, learner, entry_id, check_index, question, params, response, expected, "
               "correct, attempt, time, content_version, delivered) VALUES "
               "('k1', 'ada', 'kv-cache', 0, 'q', '{}', '6', '6.0', 1, 1, 5.0, ?, 0)", ("ab" * 32,))
    db.commit()
    db.close()
    with AnswerStore(path, readonly=True) as old:  # read-only: nothing changes, the missing columns read as NULL
        assert [(a.key, a.mistake) for a in old.attempts()] == [("k1", None)] and old.refused() == []
    assert "mistake" not in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(attempts)")}
    store = AnswerStore(path)  # a writer adds the columns and keeps the row (and its place in the outbox)
    check = make(entry_id="d-ring-buffer", question="ring", correct=False, mistake="window-plus-one", time=6.0)
    store.add(check, outbox=True)
    assert [(a.key, a.mistake) for a in store.pending()] == [("k1", None), (check.key, "window-plus-one")]
    assert store.attempts()[1] == check
    store.set_aside("k1", "refused")
    assert [a.key for a, _ in store.refused()] == ["k1"]


def test_an_attempt_written_before_mistakes_existed_still_parses_and_a_bad_mistake_is_one_line():
    old = {k: v for k, v in make().to_json().items() if k != "mistake"}  # an old outbox or page storage row
    assert Attempt.from_json(old).mistake is None
    for bad in ("Window Plus One", "", 7, "x" * 65):
        with pytest.raises(ValueError, match=r"^attempt\.mistake: expected null or a mistake id"):
            Attempt.from_json({**old, "mistake": bad})
