#!/usr/bin/env python3
"""PostgreSQL's own regression suite, directly and through refract (`make conformance`).

Fetches the regression sources of the installed server's exact version (Debian's source
package), builds regress.so, autoinc.so and refint.so, starts a throw-away PostgreSQL on
loopback, and runs `pg_regress --use-existing` with the sources' parallel_schedule directly,
then through refract in transaction pooling and in session pooling, each on a fresh copy of
one initdb. Fails on any test that passes directly but not through refract, unless
tests/conformance/allow/ holds every hunk of that test's difference (docs/postgres.md,
"Conformance: PostgreSQL's regression suite"); an unexpected hunk is printed.

Python 3 (3.9 or later) standard library only. Environment:
  REFRACT_BIN                 the refract binary (else `cargo build --profile ci -p refract`)
  CONFORMANCE_DIR             cache and output (default target/conformance)
  CONFORMANCE_MODES           runs through refract (default "transaction,session")
  CONFORMANCE_TESTS           only these tests (comma-separated; test_setup is always kept)
  CONFORMANCE_TEST_TIMEOUT    seconds a statement may run before it is cancelled (default 90; the
                              test's psql is killed 30 s later)
  CONFORMANCE_RUN_TIMEOUT     seconds one pg_regress run may take (default 1200)
  CONFORMANCE_PG_MAJOR        PostgreSQL major version (default: the installed postgresql-NN)
  REFRACT_PG_RUN_AS           the unprivileged user the servers run as under root (nobody)

`run.py --recheck` compares the last run's outputs again under the allow-list as it is now.
"""

import difflib
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = Path(os.environ.get("CONFORMANCE_DIR") or ROOT / "target" / "conformance").resolve()
ALLOW_DIR = ROOT / "tests" / "conformance" / "allow"
USER = "refract"  # the bootstrap superuser, pg_regress's user and refract's server_user
DATABASE = "regression"
REFRACT_MODES = ("transaction", "session")
MAX_ALLOWED_TESTS = 8  # the bound on tests/conformance/allow/
LIBS = {  # module -> its source in the PostgreSQL tree, and the flags its Makefile adds
    "regress": ("src/test/regress/regress.c", []),
    "autoinc": ("contrib/spi/autoinc.c", []),
    "refint": ("contrib/spi/refint.c", ["-DREFINT_VERBOSE"]),  # contrib/spi/Makefile: the tests need it
}
# A fast, throw-away server: loopback only, no Unix socket, no durability.
SERVER_SETTINGS = """
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 150
max_prepared_transactions = 20
fsync = off
full_page_writes = off
synchronous_commit = off
log_min_messages = warning
log_line_prefix = '%m [%p] %q%a '
"""
# What pg_regress's create_database() sets, which --use-existing leaves to us.
CREATE_DATABASE = f"""
CREATE DATABASE "{DATABASE}" TEMPLATE=template0;
ALTER DATABASE "{DATABASE}" SET lc_messages TO 'C';
ALTER DATABASE "{DATABASE}" SET lc_monetary TO 'C';
ALTER DATABASE "{DATABASE}" SET lc_numeric TO 'C';
ALTER DATABASE "{DATABASE}" SET lc_time TO 'C';
ALTER DATABASE "{DATABASE}" SET bytea_output TO 'hex';
ALTER DATABASE "{DATABASE}" SET timezone_abbreviations TO 'Default';
"""
REFRACT_CONFIG = """# written by tests/conformance/run.py
[listen]
http = "127.0.0.1:0"
admin = "127.0.0.1:{admin}"
workers = 2

[admin]
insecure_loopback = true

[timeouts]
drain_ms = 2000

[postgres]
listen = "127.0.0.1:{port}"
database = "{database}"
pool_mode = "{mode}"
pool_size = 40
min_idle = 1
server_user = "{user}"

[[postgres.user]]
name = "{user}"
auth = "trust"

[[postgres.server]]
name = "primary"
addr = "127.0.0.1:{server_port}"
role = "primary"
"""

T0 = time.monotonic()
SUDO = [] if os.geteuid() == 0 else ["sudo"]


class Failure(Exception):
    """A step that could not be done: the check fails, naming it."""


def log(msg):
    print(f"[conformance {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def env_int(name, default):
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        raise Failure(f"{name} must be a number of seconds")


def run(cmd, timeout, what=None, check=True, input=None, **kw):
    """Runs cmd to completion within timeout seconds; output captured (text)."""
    what = what or Path(str(cmd[0])).name
    if input is None:
        kw["stdin"] = subprocess.DEVNULL
    try:
        out = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, errors="replace",
                             input=input, **kw)
    except subprocess.TimeoutExpired:
        raise Failure(f"{what}: no answer within {timeout} s ({' '.join(map(str, cmd))})")
    except OSError as e:
        raise Failure(f"{what}: {e}")
    if check and out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-15:])
        raise Failure(f"{what} failed (exit {out.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return out


# ---------------------------------------------------------------- installing what is needed

def dpkg_version(pkg):
    out = run(["dpkg-query", "-W", "-f", "${Status}\t${Version}", pkg], 30, check=False)
    status, _, version = out.stdout.partition("\t")
    return version if out.returncode == 0 and status.endswith(" installed") else None


def pg_major():
    if os.environ.get("CONFORMANCE_PG_MAJOR"):
        return os.environ["CONFORMANCE_PG_MAJOR"]
    out = run(["dpkg-query", "-W", "-f", "${Package}\t${Status}\n", "postgresql-[0-9]*"], 30, check=False)
    majors = [int(m.group(1)) for line in out.stdout.splitlines()
              if (m := re.fullmatch(r"postgresql-(\d+)\t.* installed", line))]
    return str(max(majors)) if majors else "15"


def apt(args, timeout):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return run(SUDO + ["apt-get", *args], timeout, what="apt-get " + args[0], env=env)


def source_versions(major):
    out = run(["apt-cache", "showsrc", f"postgresql-{major}"], 120, check=False)
    return re.findall(r"^Version: (\S+)", out.stdout, re.M)


def apt_source_files():
    """Each readable apt source file, with its text."""
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    for f in files:
        try:
            yield f, f.read_text()
        except OSError:
            continue


def deb_src_entries():
    """deb-src copies of the enabled Debian (and apt.postgresql.org) `deb` entries."""
    wanted = re.compile(r"debian\.org|postgresql\.org|/debian")
    stanzas, lines = [], []
    for f, text in apt_source_files():
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                if ("deb" in fields.get("Types", "").split() and wanted.search(fields.get("URIs", ""))
                        and fields.get("Enabled", "yes").lower() != "no"):
                    stanzas.append(re.sub(r"^Types:.*$", "Types: deb-src", stanza.strip(), flags=re.M))
        elif f.suffix == ".list" or f.name == "sources.list":
            for line in text.splitlines():
                if re.match(r"\s*deb\s", line) and wanted.search(line):
                    lines.append(re.sub(r"^\s*deb\s", "deb-src ", line))
    return stanzas, lines


def has_deb_src():
    for f, text in apt_source_files():
        if (f.suffix == ".sources" and re.search(r"^Types:.*\bdeb-src\b", text, re.M)) or \
                (f.suffix in (".list", "") and re.search(r"^\s*deb-src\s", text, re.M)):
            return True
    return False


def apt_update():
    # A failing third-party list must not stop us: what we need is checked afterwards.
    run(SUDO + ["apt-get", "update", "-qq"], 600, what="apt-get update", check=False,
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def ensure_deb_src(major):
    """`apt-cache showsrc postgresql-MAJOR` answers: deb-src entries added if there are none."""
    if source_versions(major):
        return
    if not has_deb_src():
        stanzas, lines = deb_src_entries()
        if not stanzas and not lines:
            raise Failure("no Debian apt source to derive a deb-src entry from (/etc/apt/sources.list*)")
        log("adding deb-src entries for Debian's source packages")
        if stanzas:
            dest = "/etc/apt/sources.list.d/refract-deb-src.sources"
            content = ("# added by refract's tests/conformance/run.py: PostgreSQL's regression sources\n"
                       + "\n\n".join(stanzas) + "\n")
        else:
            dest = "/etc/apt/sources.list.d/refract-deb-src.list"
            content = "# added by refract's tests/conformance/run.py\n" + "\n".join(lines) + "\n"
        run(SUDO + ["tee", dest], 30, what="writing " + dest, input=content)
    apt_update()
    if not source_versions(major):
        raise Failure(f"apt-cache showsrc postgresql-{major}: no source package even with deb-src entries")


def prepare_packages(major):
    """Server, client, server-dev headers and sources of one version; returns that version."""
    server = dpkg_version(f"postgresql-{major}")
    ensure_deb_src(major)
    if server and server not in source_versions(major):
        apt_update()  # the lists may predate the installed version
    if server and server in source_versions(major):
        want = {p: server for p in (f"postgresql-server-dev-{major}", f"postgresql-client-{major}")}
        missing = [f"{p}={v}" for p, v in want.items() if dpkg_version(p) != v]
        if missing:
            log(f"installing {' '.join(missing)} (the server's version)")
            apt(["install", "-y", "-qq", *missing], 900)
    else:
        log(f"the source of postgresql-{major} {server or '(not installed)'} is not served: "
            f"installing server, client and headers at the newest version")
        apt(["install", "-y", "-qq", f"postgresql-{major}", f"postgresql-server-dev-{major}",
             f"postgresql-client-{major}"], 900)
        server = dpkg_version(f"postgresql-{major}")
        for p in (f"postgresql-server-dev-{major}", f"postgresql-client-{major}"):
            if dpkg_version(p) != server:
                apt(["install", "-y", "-qq", f"{p}={server}"], 900)
        if server not in source_versions(major):
            raise Failure(f"postgresql-{major} {server}: its source package is not served")
    if not shutil.which("dpkg-source"):
        apt(["install", "-y", "-qq", "dpkg-dev"], 900)
    return server


def fetch_sources(major, version):
    """The unpacked source tree of postgresql-MAJOR=VERSION, cached under CONF/src."""
    base = CONF / "src" / version
    marker = base / ".complete"
    if marker.exists():
        tree = base / marker.read_text().strip()
        if (tree / "src/test/regress/parallel_schedule").exists():
            return tree
    log(f"fetching the source of postgresql-{major} {version} (apt-get source)")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    run(["apt-get", "source", "-qq", "--only-source", f"postgresql-{major}={version}"], 900,
        what="apt-get source", cwd=base)
    trees = [d for d in base.iterdir() if d.is_dir() and (d / "src/test/regress/parallel_schedule").exists()]
    if len(trees) != 1:
        raise Failure(f"apt-get source left no single source tree in {base}")
    marker.write_text(trees[0].name + "\n")
    return trees[0]


def build_libs(tree, version, pg_config):
    """regress.so, autoinc.so, refint.so for this server, cached under CONF/lib/VERSION."""
    libdir = CONF / "lib" / version
    libdir.mkdir(parents=True, exist_ok=True)
    info = {k: run([pg_config, f"--{k}"], 30).stdout.strip() for k in ("includedir-server", "cflags", "cflags_sl", "cc")}
    cc = (info["cc"].split() or ["cc"])[0]
    cc = cc if shutil.which(cc) else "cc"
    # -flto and friends need the same toolchain as the server build; keep the semantic flags.
    flags = [f for f in (info["cflags"] + " " + info["cflags_sl"]).split()
             if not f.startswith(("-flto", "-ffile-prefix-map", "-fdebug-prefix-map", "-specs"))]
    stamp = libdir / ".flags"
    wanted = repr((cc, flags, LIBS))
    if stamp.exists() and stamp.read_text() == wanted and all((libdir / f"{n}.so").exists() for n in LIBS):
        return libdir
    for name, (src, extra) in LIBS.items():
        log(f"building {name}.so")
        run([cc, *flags, *extra, "-shared", "-I", info["includedir-server"], "-o", str(libdir / f"{name}.so"),
             str(tree / src)], 300, what=f"building {name}.so")
    stamp.write_text(wanted)
    return libdir


# ---------------------------------------------------------------- processes and cleanup

class Runner:
    """Starts the servers and refract as needed and takes them all down at the end."""

    def __init__(self, bindir, run_as):
        self.bindir = bindir
        self.run_as = run_as  # (name, uid, gid) or None when not root
        self.pgdata = None
        self.refract = None
        self.regress = None

    def as_server(self):
        if not self.run_as:
            return {}
        _, uid, gid = self.run_as
        return {"user": uid, "group": gid, "extra_groups": []}

    def server_tool(self, tool, args, timeout, check=True):
        env = dict(os.environ, LC_ALL="C", LANG="C")
        return run([str(self.bindir / tool), *args], timeout, what=tool, check=check, cwd="/", env=env,
                   **self.as_server())

    def give(self, path):
        if self.run_as:
            _, uid, gid = self.run_as
            for p in [path, *path.rglob("*")]:
                os.lchown(p, uid, gid)

    def initdb(self, data):
        self.server_tool("initdb", ["-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
                                    "--locale=C", "-N"], 300)
        with open(data / "postgresql.conf", "a") as f:
            f.write(SERVER_SETTINGS)

    def start_server(self, template, data, logfile):
        """A fresh copy of the template cluster, started on a free loopback port."""
        run(["cp", "-a", str(template), str(data)], 300, what="copying the cluster")
        self.pgdata = data
        last = None
        for _ in range(3):
            port = free_port()
            out = self.server_tool("pg_ctl", ["-D", str(data), "-l", str(logfile), "-w", "-t", "90",
                                              "-o", f"-p {port}", "start"], 120, check=False)
            if out.returncode == 0:
                return port
            last = out.stdout + out.stderr + tail(logfile)
        raise Failure(f"pg_ctl start failed:\n{last}")

    def stop_server(self):
        data, self.pgdata = self.pgdata, None
        if not data or not (data / "postmaster.pid").exists():
            return
        for mode, t in (("fast", 60), ("immediate", 30)):
            try:
                out = self.server_tool("pg_ctl", ["-D", str(data), "-m", mode, "-w", "-t", str(t), "stop"],
                                       t + 15, check=False)
                if out.returncode == 0 or not (data / "postmaster.pid").exists():
                    return
            except Failure:
                pass
        try:  # last resort: the postmaster's pid, first line of postmaster.pid, if it is that server
            pid = int((data / "postmaster.pid").read_text().split()[0])
            if str(data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass

    def start_refract(self, binary, config, logfile, port):
        self.refract = subprocess.Popen([str(binary), "dispatch", "--config", str(config)],
                                        stdin=subprocess.DEVNULL, stdout=open(logfile, "w"),
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        env=dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info")))
        (CONF / "refract.pid").write_text(f"{self.refract.pid}\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.refract.poll() is not None:
                raise Failure(f"refract exited ({self.refract.returncode}) at start:\n{tail(logfile)}")
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise Failure(f"refract did not listen on 127.0.0.1:{port} within 60 s:\n{tail(logfile)}")

    def stop_leftovers(self, work):
        """pg_regress, refract or a server left by a run that was killed outright (SIGKILL)."""
        for d in Path("/proc").iterdir():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
                if d.name.isdigit() and argv[0].endswith(b"/pg_regress") and f"{work}/".encode() in b" ".join(argv):
                    log(f"stopping pg_regress {d.name} left by an earlier run")
                    os.killpg(int(d.name), signal.SIGKILL)  # its own session: it and its psqls
            except (OSError, IndexError):
                pass
        pidfile = CONF / "refract.pid"
        try:
            pid = int(pidfile.read_text())
            if f"{CONF}/".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                log(f"stopping refract {pid} left by an earlier run")
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        pidfile.unlink(missing_ok=True)
        for data in (work / "pgdata", work / "template"):
            if (data / "postmaster.pid").exists():
                log(f"stopping the server left in {data} by an earlier run")
                self.pgdata = data
                self.stop_server()

    def refract_alive(self):
        return self.refract is not None and self.refract.poll() is None

    def stop_refract(self):
        p, self.refract = self.refract, None
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(15)
        (CONF / "refract.pid").unlink(missing_ok=True)
        return p.returncode

    def kill_regress(self):
        p, self.regress = self.regress, None
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(30)

    def cleanup(self):
        for step in (self.kill_regress, self.stop_refract, self.stop_server):
            try:
                step()
            except Exception as e:  # noqa: BLE001 — cleanup goes on whatever failed
                log(f"cleanup: {step.__name__}: {e}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=30):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def children(pid):
    """Processes whose parent is pid, with the test each psql reads (its stdin)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != pid:
                continue
            stdin = os.readlink(d / "fd" / "0")
        except (OSError, ValueError):
            continue
        m = re.search(r"/sql/([^/]+)\.sql$", stdin)
        found[int(d.name)] = m.group(1) if m else None
    return found


# ---------------------------------------------------------------- one pg_regress run

STATUS = re.compile(r"^(?:test\s+|\s+)(\S+)\s+\.\.\.\s+(ok|FAILED|failed \(ignored\))(.*)$", re.M)


def schedule_tests(path):
    return [t for line in Path(path).read_text().splitlines() if line.startswith("test:")
            for t in line.split(":", 1)[1].split()]


def write_schedule(src, dest, only):
    """The schedule, or only its lines' tests named in `only` (test_setup always kept)."""
    lines = []
    for line in Path(src).read_text().splitlines():
        if not line.startswith("test:"):
            continue
        tests = [t for t in line.split(":", 1)[1].split() if not only or t in only or t == "test_setup"]
        if tests:
            lines.append("test: " + " ".join(tests))
    Path(dest).write_text("\n".join(lines) + "\n")
    return [t for line in lines for t in line[5:].split()]


STUCK = """SELECT pid, coalesce(wait_event_type || '/' || wait_event, state),
       left(regexp_replace(query, '\\s+', ' ', 'g'), 160),
       CASE WHEN state = 'active' THEN pg_cancel_backend(pid) ELSE pg_terminate_backend(pid) END
  FROM pg_stat_activity
 WHERE datname = '{db}' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
   AND ((state = 'active' AND now() - state_change > make_interval(secs => {secs}))
        OR (state LIKE 'idle in transaction%' AND now() - state_change > make_interval(secs => 2 * {secs})))"""


def cancel_stuck(runner, server_port, secs):
    """Cancels server statements running for longer than secs (a test waiting forever on a
    lock that a failed test left held), and ends sessions idle in a transaction for twice as
    long; returns what they were. Cancelling, not terminating: refract takes a server
    connection closed under it for a server failure."""
    sql = STUCK.format(db=DATABASE, secs=secs)
    out = run([str(runner.bindir / "psql"), "-XAtq", "-F", "\t", "-h", "127.0.0.1", "-p", str(server_port),
               "-U", USER, "-d", "postgres", "-c", sql], 30, what="psql (watchdog)", check=False)
    return [line.split("\t")[:3] for line in out.stdout.splitlines() if line.count("\t") >= 3]


def pg_regress(runner, r, mode, port, server_port, outdir, test_timeout, run_timeout):
    """Runs the schedule against 127.0.0.1:port; returns ({test: status}, problems, seconds).

    A watchdog cancels any server statement of the database that has been running for
    test_timeout seconds, so that its test fails with an error and goes on, and kills a test's
    psql that is still running 30 s after that."""
    cmd = [str(r["pg_regress"]), "--use-existing", "--host=127.0.0.1", f"--port={port}", f"--user={USER}",
           f"--dbname={DATABASE}", f"--inputdir={r['inputdir']}", f"--outputdir={outdir}",
           f"--dlpath={r['libdir']}", f"--bindir={runner.bindir}", f"--schedule={r['schedule']}",
           "--max-concurrent-tests=20"]
    env = {"PATH": f"{runner.bindir}:/usr/bin:/bin", "HOME": str(outdir), "LANG": "C"}
    logfile = outdir / "pg_regress.log"
    problems = []
    started = time.monotonic()
    with open(logfile, "w") as out:
        runner.regress = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=outdir, env=env, start_new_session=True, **runner.as_server())
    seen = {}  # psql pid -> (test, first seen)
    killed = set()
    last_check = started
    while runner.regress.poll() is None:
        now = time.monotonic()
        if now - started > run_timeout:
            problems.append(f"{mode}: pg_regress still running after {run_timeout} s: killed")
            runner.kill_regress()
            break
        if mode != "direct" and not runner.refract_alive():
            problems.append(f"{mode}: refract exited ({runner.refract.returncode if runner.refract else '?'}) "
                            f"during the run (log: {r['refract_log']})")
            runner.kill_regress()
            break
        kids = children(runner.regress.pid)
        for pid, test in kids.items():
            seen.setdefault(pid, (test, now))
        for pid in list(seen):
            if pid not in kids:
                del seen[pid]
        if now - last_check >= 5 and any(now - first > test_timeout for _, first in seen.values()):
            last_check = now
            running = sorted({t for t, first in seen.values() if now - first > test_timeout})
            for pid, wait, query in cancel_stuck(runner, server_port, test_timeout):
                msg = (f"{mode}: a statement of {', '.join(running)} ran for {test_timeout} s "
                       f"({wait}), cancelled: {query}")
                problems.append(msg)
                log(msg)
        for pid, (test, first) in seen.items():
            if now - first > test_timeout + 30 and pid not in killed:
                killed.add(pid)
                problems.append(f"{mode}: test {test} ran longer than {test_timeout + 30} s: its psql killed")
                log(f"{mode}: test {test} still running after {test_timeout + 30} s, killing its psql")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(1)
    runner.regress = None
    return statuses(logfile), problems, time.monotonic() - started


def statuses(logfile):
    """{test: ok | FAILED | failed (ignored)} from pg_regress's output."""
    text = Path(logfile).read_text(errors="replace")
    return {m.group(1): m.group(2) for m in STATUS.finditer(text)}


# ---------------------------------------------------------------- comparing

CONTEXT = 3  # lines of the direct run's output kept around each change


def read_output(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""  # no output at all: every line of the direct run's is missing


def change_hunks(a, b):
    """The changes from the lines a (the direct run's output) to the lines b, one hunk per
    run of changed lines, never merged with a neighbour: [(@@ line, body)], the body being
    up to CONTEXT lines of a before the change (' '), the lines of a it removes ('-'), those
    of b it adds ('+') and up to CONTEXT lines of a after it (' '), joined with newlines. The
    context comes from a whatever other changes touch it, so a hunk is the same whether or
    not a change next to it happened in this run."""
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lo, hi = max(0, i1 - CONTEXT), min(len(a), i2 + CONTEXT)
        body = ([" " + l for l in a[lo:i1]] + ["-" + l for l in a[i1:i2]] + ["+" + l for l in b[j1:j2]]
                + [" " + l for l in a[i2:hi]])
        head = f"@@ -{lo + 1},{hi - lo} +{j1 - (i1 - lo) + 1},{(i1 - lo) + (j2 - j1) + (hi - i2)} @@"
        hunks.append((head, "\n".join(body)))
    return hunks


def hunks_text(hunks):
    return "".join(f"{head}\n{body}\n" for head, body in hunks)


def apply_masks(text, masks):
    """text with each match of each mask, whole lines, replaced by the one line
    '[masked G.M]'; returns (text, {G.M: matches}, [errors])."""
    counts, errors = {}, []
    for tag, rx in masks:
        def repl(m, tag=tag, text=text):
            s = m.group(0)
            if (m.start() and text[m.start() - 1] != "\n") or (s and not s.endswith("\n")):
                errors.append(f"mask {tag} matched part of a line: {s[:80]!r}")
                return s
            counts[tag] = counts.get(tag, 0) + 1
            return f"[masked {tag}]\n"
        text = rx.sub(repl, text)
    return text, counts, errors


def parse_allow(text, name):
    """One allow-list file: groups, each a '# reason: ...' line, then any '# mask: REGEX' lines
    and exact hunks (from an '@@' line). Returns ({"masks": [(G.M, regex)], "hunks": {body:
    G.H}}, errors)."""
    groups, errors, hunk, mask = [], [], None, None
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{n}"
        if line.startswith("#"):
            hunk = None
            if line.startswith("#+") and mask is not None:
                mask.append(line[2:].removeprefix(" "))  # a long mask continued
                continue
            mask = None
            m = re.match(r"#\s*(reason|mask):(.*)$", line)
            if m and m.group(1) == "reason":
                if not m.group(2).strip():
                    errors.append(f"{where}: '# reason:' without a reason")
                groups.append({"reason": m.group(2).strip(), "masks": [], "hunks": []})
            elif m:
                if not groups:
                    errors.append(f"{where}: a mask before any '# reason: ...' line")
                    continue
                mask = [m.group(2).removeprefix(" ")]
                groups[-1]["masks"].append((where, mask))
            continue
        if line.startswith("@@"):
            if not HUNK_HEAD.fullmatch(line):
                errors.append(f"{where}: a hunk starts with '@@' alone or '@@ -a,b +c,d @@' (numbers ignored)")
            if not groups:
                errors.append(f"{where}: a hunk before any '# reason: ...' line")
                groups.append({"reason": "", "masks": [], "hunks": []})
            hunk = []
            groups[-1]["hunks"].append(hunk)
            continue
        if hunk is None:
            if line.strip():
                errors.append(f"{where}: outside a hunk: only '#' lines and blank lines")
            continue
        if line == "":
            line = " "  # an empty context line whose space an editor took
        if line[0] not in " -+\\":
            errors.append(f"{where}: a hunk's lines start with ' ', '-', '+' or '\\'")
        hunk.append(line)
    entry = {"masks": [], "hunks": {}, "reasons": [g["reason"] for g in groups]}
    for g, group in enumerate(groups, 1):
        if not group["masks"] and not group["hunks"]:
            errors.append(f"{name}: group {g} ('# reason: {group['reason'][:40]}...') has no mask and no hunk")
        for m, (where, parts) in enumerate(group["masks"], 1):
            try:
                entry["masks"].append((f"{g}.{m}", re.compile("".join(parts), re.M)))
            except re.error as e:
                errors.append(f"{where}: mask {g}.{m}: {e}")
        for h, body in enumerate(group["hunks"], 1):
            if not any(l[:1] in "-+" for l in body):
                errors.append(f"{name}: hunk {g}.{h} changes no line")
            key = "\n".join(body)
            if key in entry["hunks"]:
                errors.append(f"{name}: hunk {g}.{h} repeats hunk {entry['hunks'][key]}")
            entry["hunks"].setdefault(key, f"{g}.{h}")
    if not groups:
        errors.append(f"{name}: no '# reason: ...' group")
    return entry, errors


HUNK_HEAD = re.compile(r"@@(?: -\d+(?:,\d+)? \+\d+(?:,\d+)? @@.*)?")


def load_allow():
    """tests/conformance/allow/TEST.MODE.diff (parse_allow); at most MAX_ALLOWED_TESTS tests."""
    entries, errors = {}, []
    if not ALLOW_DIR.is_dir():
        return entries, errors
    for f in sorted(p for p in ALLOW_DIR.iterdir() if not p.name.startswith(".")):
        m = re.fullmatch(r"(.+)\.(" + "|".join(REFRACT_MODES) + r")\.diff", f.name)
        if not m:
            errors.append(f"{f}: the name must be TEST.MODE.diff, MODE one of {', '.join(REFRACT_MODES)}")
            continue
        entry, errs = parse_allow(f.read_text(), f"{ALLOW_DIR.name}/{f.name}")
        errors += errs
        entry["file"] = f
        entries[(m.group(1), m.group(2))] = entry
    tests = sorted({t for t, _ in entries})
    if len(tests) > MAX_ALLOWED_TESTS:
        errors.append(f"{len(tests)} tests allowed ({', '.join(tests)}): at most {MAX_ALLOWED_TESTS}")
    return entries, errors


def compare(direct_out, mode_out, entry):
    """Compares one test's outputs under its allow-list entry (None: none). Returns a dict:
    hunks (compared, masks applied), raw (without masks, when there are masks), matched
    [G.H], unexpected [(@@ line, body)], masked {G.M: count}, errors."""
    a, b = read_output(direct_out), read_output(mode_out)
    r = {"raw": None, "matched": [], "masked": {}, "errors": []}
    if entry and entry["masks"]:
        r["raw"] = change_hunks(a.splitlines(), b.splitlines())
        a, counts_a, errs_a = apply_masks(a, entry["masks"])
        b, counts_b, errs_b = apply_masks(b, entry["masks"])
        r["masked"], r["errors"] = counts_b, errs_a + errs_b
        r["stale_masks"] = [tag for tag, _ in entry["masks"] if tag not in counts_a]
    r["hunks"] = change_hunks(a.splitlines(), b.splitlines())
    allowed = entry["hunks"] if entry else {}
    r["matched"] = [allowed[body] for _, body in r["hunks"] if body in allowed]
    r["unexpected"] = [(head, body) for head, body in r["hunks"] if body not in allowed]
    return r


# ---------------------------------------------------------------- main

def refract_binary():
    if os.environ.get("REFRACT_BIN"):
        b = Path(os.environ["REFRACT_BIN"])
        if not os.access(b, os.X_OK):
            raise Failure(f"REFRACT_BIN={b} is not an executable file")
        return b
    log("building refract (cargo build --profile ci -p refract)")
    run([os.environ.get("CARGO", "cargo"), "build", "--profile", "ci", "-p", "refract"],
        env_int("CONFORMANCE_BUILD_TIMEOUT", 3600), what="cargo build", cwd=ROOT)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    return (target if target.is_absolute() else ROOT / target) / "ci" / "refract"


def run_dir(run_as):
    """CONF/run if the servers' user can work there, else a directory in /tmp."""
    d = CONF / "run"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if not run_as:
        return d, False
    os.chmod(d, 0o755)
    os.chown(d, run_as[1], run_as[2])
    ok = run(["test", "-w", str(d), "-a", "-x", str(d)], 30, check=False, user=run_as[1], group=run_as[2],
             extra_groups=[]).returncode == 0
    if ok:
        return d, False
    t = Path(tempfile.mkdtemp(prefix="refract-conformance-"))
    os.chmod(t, 0o755)
    log(f"{run_as[0]} cannot reach {d}: running in {t} (results copied back)")
    return t, True


def recheck():
    """`run.py --recheck`: the last run's outputs (CONF/run) compared again under the
    allow-list as it is now, without running anything (for editing the allow-list)."""
    work = CONF / "run"
    if not (work / "schedule").exists() or not (work / "direct" / "pg_regress.log").exists():
        raise Failure(f"no earlier run's outputs in {work}")
    allow, allow_errors = load_allow()
    if allow_errors:
        raise Failure("allow-list:\n  " + "\n  ".join(allow_errors))
    modes = [m for m in REFRACT_MODES if (work / m / "pg_regress.log").exists()]
    results = {m: statuses(work / m / "pg_regress.log") for m in ["direct", *modes]}
    return report(work, schedule_tests(work / "schedule"), modes, results, [], allow, {},
                  f"re-check of the outputs in {work} (the run's own problems not repeated)", summary=False)


def main():
    test_timeout = env_int("CONFORMANCE_TEST_TIMEOUT", 90)
    run_timeout = env_int("CONFORMANCE_RUN_TIMEOUT", 1200)
    modes = [m.strip() for m in (os.environ.get("CONFORMANCE_MODES") or ",".join(REFRACT_MODES)).split(",")
             if m.strip()]
    if any(m not in REFRACT_MODES for m in modes):
        raise Failure(f"CONFORMANCE_MODES: each of {', '.join(REFRACT_MODES)}")
    only = {t.strip() for t in (os.environ.get("CONFORMANCE_TESTS") or "").split(",") if t.strip()}
    allow, allow_errors = load_allow()
    if allow_errors:
        raise Failure("allow-list:\n  " + "\n  ".join(allow_errors))

    major = pg_major()
    version = prepare_packages(major)
    bindir = Path(f"/usr/lib/postgresql/{major}/bin")
    pg_config = bindir / "pg_config"
    if not pg_config.exists():
        pg_config = Path(shutil.which("pg_config") or "pg_config")
    for tool in ("initdb", "pg_ctl", "postgres", "psql"):
        if not (bindir / tool).exists():
            raise Failure(f"{bindir / tool} is missing")
    version_of = lambda tool: re.search(r"\) (\d+\.\d+)", run([str(bindir / tool), "--version"], 30).stdout)[1]
    psql_version, server_version = version_of("psql"), version_of("postgres")
    pg_regress_bin = Path(run([str(pg_config), "--pgxs"], 30).stdout.strip()).parent.parent / "test/regress/pg_regress"
    if not pg_regress_bin.exists():
        raise Failure(f"{pg_regress_bin} is missing (postgresql-server-dev-{major})")
    log(f"PostgreSQL {server_version} (Debian {version}), psql {psql_version}")
    if psql_version != server_version:
        raise Failure(f"psql {psql_version} and the server {server_version} differ")
    tree = fetch_sources(major, version)
    libdir = build_libs(tree, version, pg_config)
    binary = refract_binary().resolve()
    if not binary.exists():
        raise Failure(f"{binary} does not exist")
    # Both runs use this copy, so the digest printed is that of the binary that ran even if
    # REFRACT_BIN is replaced meanwhile.
    CONF.mkdir(parents=True, exist_ok=True)
    copy = CONF / "refract.bin"
    shutil.copy2(binary, copy)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()[:16]
    built = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(copy.stat().st_mtime))
    ident = f"refract {binary} (sha256 {digest}, built {built})"
    log(ident)

    run_as = None
    if os.geteuid() == 0:
        name = os.environ.get("REFRACT_PG_RUN_AS") or "nobody"
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise Failure(f"no user {name!r} to run PostgreSQL as (REFRACT_PG_RUN_AS)")
        run_as = (name, pw.pw_uid, pw.pw_gid)

    runner = Runner(bindir, run_as)
    runner.stop_leftovers(CONF / "run")
    work, copied = run_dir(run_as)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    results, problems, took = {}, [], {}
    try:
        regress = work / "regress"
        shutil.copytree(tree / "src/test/regress", regress,
                        ignore=shutil.ignore_patterns("*.c", "*.h", "*.o", "Makefile", "GNUmakefile"))
        shutil.copytree(libdir, work / "lib")
        tests = write_schedule(regress / "parallel_schedule", work / "schedule", only)
        if only - set(tests):
            raise Failure(f"CONFORMANCE_TESTS: not in parallel_schedule: {', '.join(sorted(only - set(tests)))}")
        runner.give(work)
        log(f"initdb (run as {run_as[0] if run_as else 'this user'}) in {work}")
        template = work / "template"
        runner.initdb(template)
        r = {"pg_regress": pg_regress_bin, "inputdir": regress, "libdir": work / "lib",
             "schedule": work / "schedule", "refract_log": None}
        for mode in ["direct", *modes]:
            outdir = work / mode
            outdir.mkdir()
            runner.give(outdir)
            port = runner.start_server(template, work / "pgdata", outdir / "server.log")
            run([str(bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port),
                 "-U", USER, "-d", "postgres", *[a for stmt in CREATE_DATABASE.strip().splitlines() for a in ("-c", stmt)]], 120, what="creating the database")
            target = port
            if mode != "direct":
                r["refract_log"] = outdir / "refract.log"
                for attempt in range(3):  # a free port may be taken before refract binds it
                    target, admin = free_port(), free_port()
                    config = outdir / "refract.toml"
                    config.write_text(REFRACT_CONFIG.format(admin=admin, port=target, database=DATABASE,
                                                            mode=mode, user=USER, server_port=port))
                    try:
                        runner.start_refract(copy, config, r["refract_log"], target)
                        break
                    except Failure as e:
                        runner.stop_refract()
                        if attempt == 2 or "Address already in use" not in str(e):
                            raise
                run([str(bindir / "psql"), "-X", "-q", "-h", "127.0.0.1", "-p", str(target), "-U", USER,
                     "-d", DATABASE, "-c", "select 1"], 60, what="psql through refract")
            log(f"{mode}: pg_regress ({len(tests)} tests) against 127.0.0.1:{target}")
            statuses, trouble, took[mode] = pg_regress(runner, r, mode, target, port, outdir, test_timeout, run_timeout)
            if mode != "direct":
                code = runner.stop_refract()
                if code not in (0, None):
                    trouble.append(f"{mode}: refract exited {code} on SIGTERM (log: {r['refract_log']})")
            runner.stop_server()
            shutil.rmtree(work / "pgdata", ignore_errors=True)
            missing = [t for t in tests if t not in statuses]
            if missing:
                trouble.append(f"{mode}: no result for {len(missing)} test(s): {', '.join(missing[:10])}"
                               + (" ..." if len(missing) > 10 else ""))
            results[mode] = statuses
            problems += trouble
            ok = sum(1 for t in tests if statuses.get(t) == "ok")
            log(f"{mode}: {ok}/{len(tests)} tests passed in {took[mode]:.0f} s")
        shutil.rmtree(template, ignore_errors=True)
        code = report(work, tests, modes, results, problems, allow, took, ident)
    finally:
        runner.cleanup()
        if copied:
            dest = CONF / "run"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(work, dest, ignore=shutil.ignore_patterns("pgdata", "template"), symlinks=True)
            shutil.rmtree(work, ignore_errors=True)
    return code


SHOWN_LINES = 400  # of unexpected hunks printed in the summary (all are in MODE/diffs/)


def report(work, tests, modes, results, problems, allow, took, ident, summary=True):
    """Writes the per-test diffs and the summary; returns the exit code."""
    out_dir = CONF / "run"  # where the files end up (copied back there from /tmp if needed)
    direct = results.get("direct", {})
    passed_direct = [t for t in tests if direct.get(t) == "ok"]
    lines = [f"PostgreSQL regression suite (parallel_schedule, {len(tests)} tests); {ident}",
             f"  direct:      {len(passed_direct)}/{len(tests)} passed ({took.get('direct', 0):.0f} s)"]
    failing, detail, notes, shown = {}, [], [], 0
    for mode in modes:
        res = results.get(mode, {})
        ok = [t for t in tests if res.get(t) == "ok"]
        bad, allowed = [], []
        (work / mode / "diffs").mkdir(exist_ok=True)
        for t in passed_direct:
            if res.get(t) == "ok":
                continue
            entry = allow.get((t, mode))
            c = compare(work / "direct/results" / f"{t}.out", work / mode / "results" / f"{t}.out", entry)
            diffs = work / mode / "diffs"
            (diffs / f"{t}.diff").write_text(hunks_text(c["hunks"]))
            if c["raw"] is not None:
                (diffs / f"{t}.raw.diff").write_text(hunks_text(c["raw"]))
            notes += [f"{mode} {t}: {e}" for e in c["errors"]]
            notes += [f"{mode} {t}: mask {m} matches nothing in the direct run's output"
                      for m in c.get("stale_masks", [])]
            if entry and (c["hunks"] or c["raw"]) and not c["unexpected"] and not c["errors"]:
                used = [f"hunk {h}" for h in c["matched"]] + [f"mask {m}×{n}" for m, n in c["masked"].items()]
                allowed.append(f"{t} ({', '.join(used)})")
                continue
            bad.append(t)
            if c["errors"]:
                note = "a mask of its allow-list entry matched part of a line (allow-list notes)"
            elif not c["hunks"]:
                note = "its output is the direct run's"
            elif entry:
                note = (f"{len(c['unexpected'])} of its {len(c['hunks'])} hunks not in "
                        f"{entry['file'].relative_to(ROOT)}")
            else:
                note = f"{len(c['hunks'])} hunk(s), not allow-listed"
            detail.append(f"  {mode:11} {t:20} {res.get(t, 'no result')}: {note}: "
                          f"{out_dir / mode / 'diffs' / (t + '.diff')}")
            for head, body in c["unexpected"]:
                if shown >= SHOWN_LINES:
                    detail.append("      ... (the rest in the diff files)")
                    break
                hunk = [head, *body.splitlines()][:SHOWN_LINES - shown]
                detail += ["      | " + l for l in hunk]
                shown += len(hunk)
        failing[mode] = bad
        lines.append(f"  {mode + ':':12} {len(ok)}/{len(tests)} passed ({took.get(mode, 0):.0f} s); "
                     f"{len(bad)} of the tests passing directly fail through refract"
                     + (f"; allowed: {'; '.join(allowed)}" if allowed else ""))
    fail_direct = [t for t in tests if t in direct and direct[t] != "ok"]
    if fail_direct:
        lines.append(f"  failing directly (not compared): {', '.join(fail_direct)} "
                     f"({out_dir / 'direct' / 'regression.diffs'})")
    if detail:
        lines.append("failing through refract (hunks against the direct run's output that the allow-list does not hold):")
        lines += detail
    if notes:
        lines.append("allow-list notes:")
        lines += [f"  {n}" for n in notes]
    if problems:
        lines.append("problems:")
        lines += [f"  {p}" for p in problems]
    lines.append(f"outputs: {out_dir}/MODE/ (diffs/, results/, regression.diffs, pg_regress.log, server.log, "
                 f"refract.log)")
    verdict = "FAILED" if any(failing.values()) or problems else "passed"
    lines.append(f"conformance {verdict} ({time.monotonic() - T0:.0f} s)")
    text = "\n".join(lines) + "\n"
    if summary:
        (work / "summary.txt").write_text(text)
    print(text, end="", flush=True)
    return 1 if verdict == "FAILED" else 0


if __name__ == "__main__":
    try:
        sys.exit(recheck() if sys.argv[1:] == ["--recheck"] else main())
    except Failure as e:
        log(f"FAILED: {e}")
        sys.exit(1)
