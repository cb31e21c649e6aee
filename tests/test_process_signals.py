"""The SIGTERM handler of a stretch of work is put back after it, whatever the stretch installed."""

from __future__ import annotations

import signal
import threading

from difftransformer import process_signals
from difftransformer.process_signals import sigterm_handler


def _own(*_):
    return None


def _other(*_):
    return None


def test_the_handler_before_the_block_is_back_after_it():
    previous = signal.signal(signal.SIGTERM, _own)
    try:
        with sigterm_handler(signal.SIG_DFL):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            signal.signal(signal.SIGTERM, _other)  # as ray.init does inside compare's block
        assert signal.getsignal(signal.SIGTERM) is _own
        with sigterm_handler():
            assert signal.getsignal(signal.SIGTERM) is _own  # without `during`, left as it is inside
            signal.signal(signal.SIGTERM, _other)
        assert signal.getsignal(signal.SIGTERM) is _own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_handler_is_put_back_when_the_block_raises():
    previous = signal.signal(signal.SIGTERM, _own)
    try:
        try:
            with sigterm_handler(signal.SIG_DFL):
                raise KeyError("inside")
        except KeyError:
            pass
        assert signal.getsignal(signal.SIGTERM) is _own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_the_block_runs_untouched():
    previous = signal.signal(signal.SIGTERM, _own)
    seen = []

    def work():
        with sigterm_handler(signal.SIG_DFL):  # signal.signal would raise here
            seen.append(signal.getsignal(signal.SIGTERM))

    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        assert seen == [_own]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_keyboard_interrupt_raised_in_place_of_terminated_still_counts_as_sigterm(monkeypatch):
    monkeypatch.setattr(process_signals, "_terminated", threading.Event())  # this process's record, fresh
    assert not process_signals.was_terminated(KeyboardInterrupt())  # Ctrl-C
    try:
        process_signals.raise_terminated(signal.SIGTERM, None)
    except process_signals.Terminated as raised:
        assert process_signals.was_terminated(raised)
    # What Ray raises when the handler ran while its driver waited in C++: a plain KeyboardInterrupt.
    assert process_signals.was_terminated(KeyboardInterrupt())


def test_the_command_ends_terminated_with_143_and_interrupted_with_130(monkeypatch, capsys):
    from difftransformer import cli

    monkeypatch.setattr(process_signals, "_terminated", threading.Event())

    def stopped(*_):
        raise KeyboardInterrupt()

    monkeypatch.setattr("difftransformer.generate_cli.run", stopped)
    assert cli.main(["generate", "unused", "--prompt", "a"]) == 130
    assert capsys.readouterr().err.strip().endswith("difftransformer generate: interrupted")
    try:
        process_signals.raise_terminated(signal.SIGTERM, None)
    except process_signals.Terminated:
        pass
    assert cli.main(["generate", "unused", "--prompt", "a"]) == 143
    assert capsys.readouterr().err.strip().endswith("difftransformer generate: terminated")
