"""redis-py against qstore's Redis port: commands, errors, MULTI/EXEC, WATCH, RESP3, and
concurrent transfers whose sum MGET audits must never see change.

Usage: check_redis_py.py PORT PASSWORD
Prints one line per check and 'N passed, N failed'; exits non-zero on a failure.
"""
import sys
import threading

import redis

PORT, PASSWORD = int(sys.argv[1]), sys.argv[2]
results = []


def check(name, fn):
    try:
        fn()
        results.append((name, None))
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - any failure is reported
        results.append((name, e))
        print(f"FAIL {name}: {e!r}")


def client(**kw):
    return redis.Redis(port=PORT, password=PASSWORD, **kw)


def commands():
    r = client()
    assert r.ping()
    assert r.set("py:a", "1") is True
    assert r.get("py:a") == b"1"
    assert r.set("py:a", "2", nx=True) is None
    assert r.incr("py:a", 41) == 42
    assert r.decr("py:a") == 41
    assert r.append("py:a", "x") == 3
    assert r.strlen("py:a") == 3
    assert r.mset({"py:k1": "v1", "py:k2": "v2"}) is True
    assert r.mget(["py:k1", "py:none", "py:k2"]) == [b"v1", None, b"v2"]
    assert r.exists("py:k1", "py:k2", "py:none") == 2
    assert r.delete("py:k1", "py:k2") == 2
    assert r.get("py:k1") is None
    keys = r.dbsize()
    assert r.set("py:counted", "1") is True
    assert r.dbsize() == keys + 1
    assert r.delete("py:counted") == 1
    assert r.dbsize() == keys


def errors():
    r = client()
    r.set("py:s", "abc")
    try:
        r.incr("py:s")
        raise AssertionError("INCR of a string did not raise")
    except redis.exceptions.ResponseError as e:
        assert "not an integer" in str(e), e
    try:
        redis.Redis(port=PORT, password="wrong").ping()
        raise AssertionError("a wrong password was let in")
    except redis.exceptions.AuthenticationError:
        pass
    try:
        redis.Redis(port=PORT).get("py:a")
        raise AssertionError("no password was let in")
    except redis.exceptions.AuthenticationError:
        pass


def multi_exec():
    r = client()
    p = r.pipeline(transaction=True)
    p.set("py:t", 1).incr("py:t").get("py:t")
    assert p.execute() == [True, 2, b"2"]


def watch():
    r, other = client(), client()
    r.set("py:w", "0")
    with r.pipeline() as p:
        p.watch("py:w")
        other.set("py:w", "changed")
        p.multi()
        p.set("py:w", "mine")
        try:
            p.execute()
            raise AssertionError("EXEC ran although a watched key changed")
        except redis.exceptions.WatchError:
            pass
    assert r.get("py:w") == b"changed"


def resp3():
    r = client(protocol=3)
    r.set("py:r3", "v")
    assert r.get("py:r3") == b"v"
    assert r.get("py:none") is None


ACCOUNTS = [f"py:acct:{i}" for i in range(6)]
START = 100


def transfers():
    r = client()
    r.mset({k: START for k in ACCOUNTS})
    stop = threading.Event()
    failures = []
    done = [0]
    audits = [0]

    def move(t):
        c = client()
        for i in range(60):
            a, b = ACCOUNTS[(t + i) % 6], ACCOUNTS[(t * 5 + 2 * i + 1) % 6]
            if a == b:
                continue

            def txn(p):
                x, y = int(p.get(a)), int(p.get(b))
                p.multi()
                p.set(a, x - 1)
                p.set(b, y + 1)

            c.transaction(txn, a, b)
            done[0] += 1

    def audit():
        c = client()
        while not stop.is_set():
            total = sum(int(v) for v in c.mget(ACCOUNTS))
            if total != START * len(ACCOUNTS):
                failures.append(total)
            audits[0] += 1

    movers = [threading.Thread(target=move, args=(t,)) for t in range(4)]
    auditors = [threading.Thread(target=audit) for _ in range(2)]
    for t in movers + auditors:
        t.start()
    for t in movers:
        t.join()
    stop.set()
    for t in auditors:
        t.join()
    assert not failures, f"audits saw sums {failures[:5]}"
    assert sum(int(v) for v in r.mget(ACCOUNTS)) == START * len(ACCOUNTS)
    print(f"     {done[0]} transfers, {audits[0]} audits, sum kept")


for name, fn in [
    ("commands", commands),
    ("errors raise redis-py's exceptions", errors),
    ("MULTI/EXEC pipeline", multi_exec),
    ("WATCH aborts EXEC on a change", watch),
    ("RESP3 (protocol=3)", resp3),
    ("concurrent transfers keep the sum", transfers),
]:
    check(name, fn)

failed = sum(1 for _, e in results if e)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
