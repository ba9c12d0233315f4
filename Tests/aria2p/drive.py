"""Drives `pickup serve --aria2-rpc` with aria2p, as aria2p's users drive aria2c.

Run by Aria2ClientTests (Swift) with the venv that .ci/run makes (aria2p pinned there):

    python drive.py --port PORT --secret TOKEN --root DIR --slow URL --fast URL --fast-size N

Each step prints `ok <step>`; the last line is `ALL OK`. Any failed check raises, and the
script exits non-zero with the traceback. Every wait is bounded.
"""

import argparse
import json
import os
import sys
import threading
import traceback
import time

import aria2p
import websocket
from aria2p import ClientException

DEADLINE = 90.0


def wait_for(what, condition, seconds=DEADLINE):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def expect_fault(call, code, text):
    try:
        call()
    except ClientException as e:
        assert e.code == code, (e.code, e.message)
        assert text in e.message, e.message
        return e
    raise AssertionError(f"expected a fault with {text!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--slow", required=True)
    p.add_argument("--fast", required=True)
    p.add_argument("--fast-size", type=int, required=True)
    a = p.parse_args()
    a.root = os.path.realpath(a.root)

    client = aria2p.Client(host="http://127.0.0.1", port=a.port, secret=a.secret, timeout=30)
    api = aria2p.API(client)

    # The secret: a wrong one is aria2's Unauthorized; the listings need none.
    intruder = aria2p.Client(host="http://127.0.0.1", port=a.port, secret="wrong", timeout=30)
    expect_fault(intruder.get_global_stat, 1, "Unauthorized")
    expect_fault(aria2p.Client(host="http://127.0.0.1", port=a.port, timeout=30).tell_active, 1, "Unauthorized")
    assert "aria2.addUri" in intruder.list_methods()
    assert "aria2.onDownloadComplete" in intruder.list_notifications()
    version = client.get_version()
    assert version["version"] and isinstance(version["enabledFeatures"], list), version
    print("ok secret", flush=True)

    # Notifications over WebSocket: a raw client (JSON-RPC over the socket too), and aria2p's
    # own listener in a thread of its own, as its users listen.
    raw = websocket.create_connection(f"ws://127.0.0.1:{a.port}/jsonrpc", timeout=DEADLINE)
    raw.send(json.dumps({"jsonrpc": "2.0", "id": "v", "method": "aria2.getVersion", "params": [f"token:{a.secret}"]}))
    answer = json.loads(raw.recv())
    assert answer["id"] == "v" and "version" in answer["result"], answer
    # The answer came after the socket joined the notifications: none is missed from here on.
    events = {"pause": threading.Event(), "complete": threading.Event()}
    completed = {}

    def on_pause(_api, gid):
        events["pause"].set()

    def on_complete(_api, gid):
        completed[gid] = True
        events["complete"].set()

    api.listen_to_notifications(threaded=True, on_download_pause=on_pause, on_download_complete=on_complete, timeout=1)

    # A slow download: running, paused, resumed, its options changed.
    slow = api.add_uris([a.slow], options={"out": "slow.bin", "dir": a.root})
    assert len(slow.gid) == 16 and int(slow.gid, 16) >= 0, slow.gid
    wait_for("the slow download to run", lambda: api.get_download(slow.gid).is_active)
    wait_for("the slow download's length", lambda: api.get_download(slow.gid).total_length > 0)
    slow.update()
    assert slow.name == "slow.bin", slow.name
    assert str(slow.dir) == a.root, slow.dir
    assert slow.total_length > 0 and slow.files[0].path.name == "slow.bin"
    # Paused until aria2p's listener has seen a pause: then it is connected (bounded tries).
    for _ in range(30):
        assert api.pause([slow]) == [True]
        wait_for("the pause", lambda: api.get_download(slow.gid).is_paused)
        if events["pause"].wait(1):
            break
        assert api.resume([slow]) == [True]
        wait_for("the resume", lambda: not api.get_download(slow.gid).is_paused)
    assert events["pause"].is_set(), "aria2p's listener saw no onDownloadPause"
    expect_fault(lambda: client.pause(slow.gid), 1, "cannot be paused now")
    assert api.resume([slow]) == [True]
    wait_for("the resume", lambda: api.get_download(slow.gid).status in ("waiting", "active"))
    assert api.set_options({"max-download-limit": "64K"}, [slow]) == [True]
    opts = api.get_options([slow])[0]
    assert opts.get("max-download-limit") == "65536", opts.get("max-download-limit")
    assert opts.get("dir") == a.root, opts.get("dir")
    print("ok pause resume options", flush=True)

    # A fast one to completion, with its notification.
    fast = api.add_uris([a.fast], options={"out": "fast.bin", "split": "2"})
    wait_for("the fast download to complete", lambda: api.get_download(fast.gid).is_complete)
    fast.update()
    assert fast.total_length == a.fast_size and fast.completed_length == a.fast_size, (fast.total_length, fast.completed_length)
    assert os.path.getsize(os.path.join(a.root, "fast.bin")) == a.fast_size
    assert fast.files[0].path == fast.dir / "fast.bin"
    seen = []
    end = time.monotonic() + DEADLINE
    while ("aria2.onDownloadComplete", fast.gid) not in seen and time.monotonic() < end:
        note = json.loads(raw.recv())
        seen.append((note.get("method"), note.get("params", [{}])[0].get("gid")))
    assert ("aria2.onDownloadComplete", fast.gid) in seen, seen
    assert ("aria2.onDownloadStart", fast.gid) in seen, seen
    raw.close()
    assert events["complete"].wait(DEADLINE), "aria2p's listener saw no onDownloadComplete"
    assert completed.get(fast.gid), completed
    print(f"ok notification onDownloadComplete {fast.gid}", flush=True)

    # The lists: active, waiting, stopped.
    gids = {d.gid: d.status for d in api.get_downloads()}
    assert gids.get(fast.gid) == "complete", gids
    assert gids.get(slow.gid) in ("active", "waiting"), gids
    stopped = client.tell_stopped(0, 1000, ["gid", "status", "totalLength"])
    assert {"gid": fast.gid, "status": "complete", "totalLength": str(a.fast_size)} in stopped, stopped
    assert client.tell_waiting(0, 1000) is not None
    print("ok lists", flush=True)

    # Stats and global options.
    stats = api.get_stats()
    assert stats.num_stopped >= 1 and stats.num_active + stats.num_waiting >= 1, stats._struct
    globals_before = api.get_global_options()
    assert globals_before.get("dir") == a.root
    assert api.set_global_options({"max-concurrent-downloads": "2", "max-overall-download-limit": "0"})
    assert api.get_global_options().get("max-concurrent-downloads") == "2"
    print("ok stats global options", flush=True)

    # Multicall, and a bad GID.
    results = client.multicall2([(client.TELL_STATUS, [fast.gid, ["status"]]), (client.GET_VERSION, [])])
    assert results[0] == [{"status": "complete"}], results
    expect_fault(lambda: client.tell_status("nothex"), 1, "Invalid GID")
    expect_fault(lambda: client.tell_status("00000000000fffff"), 1, "No such download")
    print("ok multicall", flush=True)

    # Remove: aria2p removes the download, then its result. The partial file stays (Pickup's rule).
    assert api.remove([slow]) == [True]
    assert slow.gid not in {d.gid for d in api.get_downloads()}
    assert os.path.exists(os.path.join(a.root, "slow.bin.pickup-part")), os.listdir(a.root)

    # A removed download stays as a result (status removed) until purged.
    again = api.add_uris([a.slow], options={"out": "slow.bin", "pause": "true"})
    assert api.get_download(again.gid).is_paused
    assert client.remove(again.gid) == again.gid
    assert client.tell_status(again.gid, ["status"]) == {"status": "removed"}
    assert again.gid in {d["gid"] for d in client.tell_stopped(0, 1000, ["gid"])}
    assert api.purge()
    left = {d.gid for d in api.get_downloads()}
    assert again.gid not in left and fast.gid not in left, left
    assert os.path.getsize(os.path.join(a.root, "fast.bin")) == a.fast_size, "purging deletes no file"
    print("ok remove purge", flush=True)

    listener = api.listener
    client.stop_listening()
    listener.join(timeout=DEADLINE)
    assert not listener.is_alive(), "aria2p's listener did not stop"
    print("ALL OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        # aria2p's listener is a thread that would keep the process alive.
        os._exit(1)
