# Seeds N ready jobs (queue "bench", tenant "default", 100-byte payloads) into a qd
# database whose schema qd created. Usage: seed-ready-jobs.py path/to/qd.db N
import sqlite3, sys, os, struct, time
path, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(path)
c.execute("PRAGMA journal_mode=WAL")
t0 = time.time()
ms = int(time.time()*1000) - 60000
rows = []
def gen():
    for i in range(n):
        # UUIDv7-like: 48-bit ms, version 7, then counter
        t = ms + i // 1000
        b = struct.pack(">Q", (t << 16) | 0x7000 | (i & 0xfff)) + struct.pack(">Q", 0x8000000000000000 | i)
        yield b
c.execute("BEGIN")
c.executemany("INSERT INTO jobs (id, queue, tenant, idempotency_key, state, attempts, budget_start, max_attempts, lease_seq, created_at, ready_at, updated_at, last_error) VALUES (?, 'bench', 'default', NULL, 'ready', 0, 0, 5, 0, ?, ?, ?, NULL)",
              ((b, ms, ms, ms) for b in gen()))
payload = b"x" * 100
c.executemany("INSERT INTO payloads (job_id, body) VALUES (?, ?)", ((b, payload) for b in gen()))
c.execute("COMMIT")
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
c.close()
print(f"seeded {n} in {time.time()-t0:.1f}s", file=sys.stderr)
