"""tests/preloaded.py: a command forked from the preloaded interpreter shows what ``python`` would
have shown: its exit code, streams, environment, working directory, ``__main__`` and exit
handlers, and ``subprocess.Popen``'s face for waiting and signals."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import preloaded


def test_exit_codes_streams_and_arguments_are_the_interpreters() -> None:
    code = "import sys; print('out', sys.argv[1:], __name__); print('err', file=sys.stderr); sys.exit(int(sys.argv[1]))"
    done = preloaded.run([sys.executable, "-c", code, "3", "x"], timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out ['3', 'x'] __main__\n", "err\n")
    assert preloaded.run([sys.executable, "-c", "raise SystemExit"], timeout=60).returncode == 0
    failed = preloaded.run([sys.executable, "-c", "1 / 0"], timeout=60)
    assert failed.returncode == 1 and failed.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    with pytest.raises(subprocess.CalledProcessError):
        preloaded.run([sys.executable, "-c", "raise SystemExit(2)"], timeout=60, check=True)


def test_environment_directory_script_and_exit_handlers(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    (tmp_path / "beside.py").write_text("WHERE = 'beside the script'\n")
    script.write_text(textwrap.dedent("""
        import atexit, os, sys
        import beside
        atexit.register(lambda: print("exit handler ran"))
        print(os.environ.get("ONLY_HERE"), os.environ.get("HOME") is None, os.getcwd(), beside.WHERE, __name__)
    """))
    done = preloaded.run([sys.executable, str(script)], env={"ONLY_HERE": "yes"}, timeout=60)
    assert done.returncode == 0, done.stderr
    process = preloaded.popen([sys.executable, str(script)], env={"ONLY_HERE": "no"}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = process.communicate(timeout=60)
    assert done.stdout.splitlines()[1:] == ["exit handler ran"]
    assert out.splitlines() == [f"no True {tmp_path} beside the script __main__", "exit handler ran"]


def test_a_module_runs_as_with_dash_m() -> None:
    done = preloaded.run([sys.executable, "-m", "mmfront.cli", "--version"], timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("mmfront ")


def test_wait_poll_and_signals_have_popens_meaning() -> None:
    process = preloaded.popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    assert process.poll() is None and process.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM == process.poll()
    process.kill()  # after the exit: nothing to signal, as with Popen
    with preloaded.popen([sys.executable, "-c", "import time; time.sleep(60)"]) as sleeper:
        sleeper.kill()
    assert sleeper.returncode == -signal.SIGKILL


def test_what_is_not_a_command_of_this_interpreter_is_refused() -> None:
    with pytest.raises(ValueError, match="not a command of this interpreter"):
        preloaded.popen(["/bin/true"])
    with pytest.raises(ValueError, match="no stdin"):
        preloaded.popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)


def test_omp_num_threads_given_to_a_command_is_its_torch_threads() -> None:
    code = "import torch; print(torch.get_num_threads())"
    done = preloaded.run([sys.executable, "-c", code], env={"OMP_NUM_THREADS": "1"}, timeout=60)
    assert done.stdout == "1\n", done.stderr



def test_pass_fds_are_open_in_the_command_at_their_numbers_and_inheritable() -> None:
    read, write = os.pipe()
    number = fcntl.fcntl(write, fcntl.F_DUPFD_CLOEXEC, 700)  # one the preloaded child has not opened itself
    os.close(write)
    code = f"import os; os.write({number}, b'through'); print(os.get_inheritable({number}))"
    try:
        passed = preloaded.popen([sys.executable, "-c", code], pass_fds=(number,), stdout=subprocess.PIPE, text=True)
        out, _ = passed.communicate(timeout=60)
        absent = preloaded.run([sys.executable, "-c", code], timeout=60)
    finally:
        os.close(number)
    with os.fdopen(read, "rb") as through:
        assert (passed.returncode, out, through.read()) == (0, "True\n", b"through")
    assert absent.returncode == 1 and absent.stderr.rstrip().endswith("OSError: [Errno 9] Bad file descriptor")
