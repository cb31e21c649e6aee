"""The SIGTERM handler of a stretch of work is put back after it, whatever the stretch installed."""

from __future__ import annotations

import signal
import threading

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
